//go:build linux

package linuxns

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sandgate/sandgate/sandbox"
)

// CheckpointImages is the dir of checkpoint ck's CRIU images.
func CheckpointImages(ck sandbox.Checkpoint) string { return ck.(*checkpoint).dir }

// CRIU's MntEntry (images/mnt.proto) fields the tampering touches.
const (
	mntID         = 2
	mntParentID   = 4
	mntFlags      = 5
	mntMountpoint = 7
)

// AddImageBind tampers with the mount image in dir as an attacker who
// can write it would: it adds a copy of the mount at like (a bind of a
// host dir: its external key names the host's) at the new mountpoint at,
// with flags (MS_* bits), under the mount that holds at.
func AddImageBind(dir, like, at string, flags uint64) error {
	return editMountImage(dir, func(entries [][]byte) ([][]byte, error) {
		var src []byte
		var maxID, parent uint64
		parentAt := ""
		for _, e := range entries {
			mp, id := string(mntField(e, mntMountpoint)), varintField(e, mntID)
			maxID = max(maxID, id)
			if mp == like {
				src = e
			}
			if (at == mp || strings.HasPrefix(at, strings.TrimSuffix(mp, "/")+"/")) && len(mp) > len(parentAt) {
				parent, parentAt = id, mp
			}
		}
		if src == nil || parentAt == "" {
			return nil, fmt.Errorf("no mount at %s, or none holding %s", like, at)
		}
		e := setField(src, mntID, protowire.AppendVarint(nil, maxID+1))
		e = setField(e, mntParentID, protowire.AppendVarint(nil, parent))
		e = setField(e, mntFlags, protowire.AppendVarint(nil, flags))
		e = setField(e, mntMountpoint, protowire.AppendBytes(nil, []byte(at)))
		return append(entries, e), nil
	})
}

// SetImageMountFlags tampers with the flags (MS_* bits) of the mount at
// at in the mount image in dir.
func SetImageMountFlags(dir, at string, flags uint64) error {
	return editMountImage(dir, func(entries [][]byte) ([][]byte, error) {
		for i, e := range entries {
			if string(mntField(e, mntMountpoint)) == at {
				entries[i] = setField(e, mntFlags, protowire.AppendVarint(nil, flags))
				return entries, nil
			}
		}
		return nil, fmt.Errorf("no mount at %s", at)
	})
}

// editMountImage rewrites the one mountpoints image in dir (two magic
// words, then records: a size and a MntEntry) with edit.
func editMountImage(dir string, edit func([][]byte) ([][]byte, error)) error {
	imgs, _ := filepath.Glob(filepath.Join(dir, "mountpoints-*.img"))
	if len(imgs) != 1 {
		return fmt.Errorf("%d mount images in %s", len(imgs), dir)
	}
	b, err := os.ReadFile(imgs[0])
	if err != nil {
		return err
	}
	if len(b) < 8 {
		return errors.New("short image")
	}
	var entries [][]byte
	for rest := b[8:]; len(rest) > 0; {
		size := uint64(binary.LittleEndian.Uint32(rest[:4]))
		entries = append(entries, rest[4:4+size])
		rest = rest[4+size:]
	}
	if entries, err = edit(entries); err != nil {
		return err
	}
	out := b[:8:8]
	for _, e := range entries {
		out = binary.LittleEndian.AppendUint32(out, uint32(len(e)))
		out = append(out, e...)
	}
	return os.WriteFile(imgs[0], out, 0o600)
}

// mntField is field num of MntEntry e, as its bytes.
func mntField(e []byte, num protowire.Number) []byte {
	var v []byte
	_ = eachField(e, func(n protowire.Number, _ protowire.Type, b []byte) {
		if n == num {
			v = b
		}
	})
	return v
}

// varintField is varint field num of protobuf e.
func varintField(e []byte, num protowire.Number) uint64 {
	var v uint64
	for len(e) > 0 {
		n, typ, l := protowire.ConsumeTag(e)
		if l < 0 {
			return 0
		}
		e = e[l:]
		m := protowire.ConsumeFieldValue(n, typ, e)
		if m < 0 {
			return 0
		}
		if n == num && typ == protowire.VarintType {
			v, _ = protowire.ConsumeVarint(e[:m])
		}
		e = e[m:]
	}
	return v
}

// setField replaces field num of protobuf e by the encoded value val
// (its type kept).
func setField(e []byte, num protowire.Number, val []byte) []byte {
	var out []byte
	for len(e) > 0 {
		n, typ, l := protowire.ConsumeTag(e)
		tag := e[:l]
		e = e[l:]
		m := protowire.ConsumeFieldValue(n, typ, e)
		if n == num {
			out = append(append(out, tag...), val...)
		} else {
			out = append(append(out, tag...), e[:m]...)
		}
		e = e[m:]
	}
	return out
}

// MountCheck checks running sandbox sb's mounts as a restore's are
// checked, against a record of them made now: what the check costs.
func MountCheck(sb sandbox.Sandbox) (time.Duration, error) {
	s := sb.(*linuxSandbox)
	s.mu.Lock()
	st := *s.st
	s.mu.Unlock()
	rec, err := readMounts(st.Pid)
	if err != nil {
		return 0, err
	}
	pids, err := processTree(st.Pid)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	err = checkMounts(&st, pids, rec)
	return time.Since(start), err
}
