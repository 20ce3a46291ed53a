package sftpd

import (
	"encoding/binary"
	"errors"
)

// SFTP v3 packet types (draft-ietf-secsh-filexfer-02).
const (
	fxpInit          = 1
	fxpVersion       = 2
	fxpOpen          = 3
	fxpClose         = 4
	fxpRead          = 5
	fxpWrite         = 6
	fxpLstat         = 7
	fxpFstat         = 8
	fxpSetstat       = 9
	fxpFsetstat      = 10
	fxpOpendir       = 11
	fxpReaddir       = 12
	fxpRemove        = 13
	fxpMkdir         = 14
	fxpRmdir         = 15
	fxpRealpath      = 16
	fxpStat          = 17
	fxpRename        = 18
	fxpReadlink      = 19
	fxpSymlink       = 20
	fxpStatus        = 101
	fxpHandle        = 102
	fxpData          = 103
	fxpName          = 104
	fxpAttrs         = 105
	fxpExtended      = 200
	fxpExtendedReply = 201
)

// Status codes.
const (
	fxOK               = 0
	fxEOF              = 1
	fxNoSuchFile       = 2
	fxPermissionDenied = 3
	fxFailure          = 4
	fxBadMessage       = 5
	fxOpUnsupported    = 8
)

// OPEN flags.
const (
	fxfRead   = 0x01
	fxfWrite  = 0x02
	fxfAppend = 0x04
	fxfCreat  = 0x08
	fxfTrunc  = 0x10
	fxfExcl   = 0x20
)

// Attribute flags.
const (
	attrSize        = 0x00000001
	attrUIDGID      = 0x00000002
	attrPermissions = 0x00000004
	attrACModTime   = 0x00000008
	attrExtended    = 0x80000000
)

var errShort = errors.New("sftp: packet too short")

// decoder reads the fields of one request body; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uint32() uint32 {
	if d.err != nil || len(d.b) < 4 {
		d.err = errShort
		return 0
	}
	v := binary.BigEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *decoder) uint64() uint64 {
	if d.err != nil || len(d.b) < 8 {
		d.err = errShort
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

// bytes returns a string field without copying: it aliases the packet.
func (d *decoder) bytes() []byte {
	n := d.uint32()
	if d.err != nil || uint64(n) > uint64(len(d.b)) {
		d.err = errShort
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.bytes()) }

// attrs decodes an ATTRS structure.
func (d *decoder) attrs() attrs {
	var a attrs
	a.flags = d.uint32()
	if a.flags&attrSize != 0 {
		a.size = d.uint64()
	}
	if a.flags&attrUIDGID != 0 {
		a.uid, a.gid = d.uint32(), d.uint32()
	}
	if a.flags&attrPermissions != 0 {
		a.perm = d.uint32()
	}
	if a.flags&attrACModTime != 0 {
		a.atime, a.mtime = d.uint32(), d.uint32()
	}
	if a.flags&attrExtended != 0 {
		n := d.uint32()
		for i := uint32(0); i < n && d.err == nil; i++ {
			d.bytes()
			d.bytes()
		}
	}
	return a
}

// attrs is the SFTP v3 ATTRS structure.
type attrs struct {
	flags        uint32
	size         uint64
	uid, gid     uint32
	perm         uint32
	atime, mtime uint32
}

// encoder appends the fields of one reply.
type encoder []byte

func (e encoder) uint32(v uint32) encoder { return binary.BigEndian.AppendUint32(e, v) }
func (e encoder) uint64(v uint64) encoder { return binary.BigEndian.AppendUint64(e, v) }
func (e encoder) byte(v byte) encoder     { return append(e, v) }

func (e encoder) string(s string) encoder {
	return append(e.uint32(uint32(len(s))), s...)
}

func (e encoder) attrs(a attrs) encoder {
	e = e.uint32(a.flags)
	if a.flags&attrSize != 0 {
		e = e.uint64(a.size)
	}
	if a.flags&attrUIDGID != 0 {
		e = e.uint32(a.uid).uint32(a.gid)
	}
	if a.flags&attrPermissions != 0 {
		e = e.uint32(a.perm)
	}
	if a.flags&attrACModTime != 0 {
		e = e.uint32(a.atime).uint32(a.mtime)
	}
	return e
}
