package envd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/dataplane"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/filesystem"
)

// maxListEntries bounds a ListDir's answer (all depths together): past
// it the call fails with resource_exhausted rather than answer part of
// the tree as if it were all.
const maxListEntries = dataplane.MaxListEntries

// maxListDepth bounds ListDir's depth (0 and 1: the directory's own
// entries).
const maxListDepth = 64

// fsService is filesystem.Filesystem over the session's SFTP server, as
// /v1's file calls use it (dataplane.Files).
type fsService struct {
	s *Server
}

// open is the session's SFTP server for one call; stream counts it as a
// transfer (dataplane.Files' bounds).
func (s *Server) open(ctx context.Context, c call, stream bool) (*dataplane.FS, error) {
	fsys, err := s.d.Plane.Files.Open(ctx, c.sess.ID, c.sess.Tenant, c.sess, stream)
	if err != nil {
		return nil, s.toRPC(ctx, err, "open the sandbox's files")
	}
	return fsys, nil
}

// openAt is the preamble of a call on one path: the call, the checked
// path, and the session's files (the caller closes them).
func (f *fsService) openAt(ctx context.Context, raw string) (call, string, *dataplane.FS, error) {
	c := callOf(ctx)
	p, err := checkPath(raw)
	if err != nil {
		return c, "", nil, err
	}
	fsys, err := f.s.open(ctx, c, false)
	if err != nil {
		return c, "", nil, err
	}
	return c, p, fsys, nil
}

// checkPath validates a client's path (relative paths start at the
// sandbox's workspace).
func checkPath(p string) (string, error) {
	cp, err := dataplane.CheckPath(p)
	if err != nil {
		return "", invalid("invalid_path", err.(*dataplane.Error).Msg)
	}
	return cp, nil
}

// owners names uids and gids from the sandbox's /etc/passwd and
// /etc/group, read once per call when first needed.
type owners struct {
	fsys          *dataplane.FS
	loaded        bool
	users, groups map[uint32]string
}

// maxIDFile bounds what is read of /etc/passwd or /etc/group.
const maxIDFile = 256 << 10

func (o *owners) load() {
	o.loaded = true
	o.users, o.groups = readIDs(o.fsys, "/etc/passwd"), readIDs(o.fsys, "/etc/group")
}

// readIDs reads name:x:id lines of an /etc/passwd-like file.
func readIDs(fsys *dataplane.FS, p string) map[uint32]string {
	ids := map[uint32]string{}
	f, _, err := fsys.Open(p)
	if err != nil {
		return ids
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, maxIDFile))
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), ":", 4)
		if len(fields) < 3 {
			continue
		}
		if n, err := strconv.ParseUint(fields[2], 10, 32); err == nil {
			if _, ok := ids[uint32(n)]; !ok {
				ids[uint32(n)] = fields[0]
			}
		}
	}
	return ids
}

func (o *owners) name(m map[uint32]string, id uint32) string {
	if n, ok := m[id]; ok {
		return n
	}
	return strconv.FormatUint(uint64(id), 10)
}

func (o *owners) user(id uint32) string {
	if id == 0 {
		return "root"
	}
	if !o.loaded {
		o.load()
	}
	return o.name(o.users, id)
}

func (o *owners) group(id uint32) string {
	if id == 0 {
		return "root"
	}
	if !o.loaded {
		o.load()
	}
	return o.name(o.groups, id)
}

// entryInfo describes e as envd does: a symlink has its target's type
// with is_symlink set (FILE_TYPE_SYMLINK when it dangles) and its target.
func entryInfo(fsys *dataplane.FS, o *owners, e dataplane.Entry) *filesystem.EntryInfo {
	perm, _ := strconv.ParseUint(e.Mode, 8, 32)
	mode := fs.FileMode(perm) & fs.ModePerm
	info := &filesystem.EntryInfo{
		Name: e.Name, Path: e.Path, Size: e.SizeBytes, Mode: uint32(perm),
		Owner: o.user(e.UID), Group: o.group(e.GID), ModifiedTime: timestamppb.New(e.Mtime),
	}
	typ := e.Type
	if e.Type == "symlink" {
		info.IsSymlink = true
		mode |= fs.ModeSymlink
		if t, err := fsys.ReadLink(e.Path); err == nil {
			info.SymlinkTarget = &t
		}
		typ = "symlink"
		if st, err := fsys.Stat(e.Path); err == nil {
			typ = st.Type
		}
	}
	switch typ {
	case "file":
		info.Type = filesystem.FileType_FILE_TYPE_FILE
	case "dir":
		info.Type = filesystem.FileType_FILE_TYPE_DIRECTORY
		if !info.IsSymlink {
			mode |= fs.ModeDir
		}
	case "symlink":
		info.Type = filesystem.FileType_FILE_TYPE_SYMLINK
	}
	info.Permissions = mode.String()
	return info
}

// stat is p's entry (a final symlink not followed).
func stat(fsys *dataplane.FS, o *owners, p string) (*filesystem.EntryInfo, error) {
	e, err := fsys.Lstat(p)
	if err != nil {
		return nil, err
	}
	return entryInfo(fsys, o, e), nil
}

// Stat describes a path.
func (f *fsService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	_, p, fsys, err := f.openAt(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	defer fsys.Close()
	info, err := stat(fsys, &owners{fsys: fsys}, p)
	if err != nil {
		return nil, f.s.toRPC(ctx, err, "stat")
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: info}), nil
}

// MakeDir creates a directory and its missing parents; already_exists
// when the path exists (the SDK's make_dir then answers False).
func (f *fsService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	c, p, fsys, err := f.openAt(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	defer fsys.Close()
	o := &owners{fsys: fsys}
	if e, err := fsys.Lstat(p); err == nil {
		if e.Type == "dir" {
			return nil, rpcError(connect.CodeAlreadyExists, "file_exists", p+": directory already exists")
		}
		return nil, rpcError(connect.CodeAlreadyExists, "file_exists", p+": path already exists and is not a directory")
	}
	if err := fsys.Mkdirs(p); err != nil {
		return nil, f.s.toRPC(ctx, err, "make directory")
	}
	c.sess.Audit(ctx, audit.Event{Kind: audit.KindFile, Source: "rest", Op: "mkdir", Path: p, Result: "ok"})
	info, err := stat(fsys, o, p)
	if err != nil {
		return nil, f.s.toRPC(ctx, err, "stat")
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: info}), nil
}

// Move renames a file or directory, creating the destination's missing
// parents as envd does.
func (f *fsService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	c := callOf(ctx)
	src, err := checkPath(req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := checkPath(req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	fsys, err := f.s.open(ctx, c, false)
	if err != nil {
		return nil, err
	}
	defer fsys.Close()
	if _, err := fsys.Lstat(src); err != nil {
		return nil, f.s.toRPC(ctx, err, "move")
	}
	if err := fsys.Mkdirs(path.Dir(dst)); err != nil {
		return nil, f.s.toRPC(ctx, err, "move")
	}
	if err := fsys.Rename(src, dst); err != nil {
		return nil, f.s.toRPC(ctx, err, "move")
	}
	c.sess.Audit(ctx, audit.Event{Kind: audit.KindFile, Source: "rest", Op: "rename", Path: src, Target: dst, Result: "ok"})
	info, err := stat(fsys, &owners{fsys: fsys}, dst)
	if err != nil {
		return nil, f.s.toRPC(ctx, err, "stat")
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: info}), nil
}

// ListDir lists a directory down to depth levels (0 or 1: its own
// entries), never into a symlinked directory.
func (f *fsService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	c := callOf(ctx)
	p, err := checkPath(req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(max(req.Msg.GetDepth(), 1))
	if depth > maxListDepth {
		return nil, invalid("invalid_field", fmt.Sprintf("depth must be at most %d", maxListDepth))
	}
	fsys, err := f.s.open(ctx, c, false)
	if err != nil {
		return nil, err
	}
	defer fsys.Close()
	o := &owners{fsys: fsys}
	res := &filesystem.ListDirResponse{Entries: []*filesystem.EntryInfo{}}
	type dir struct {
		p     string
		level int
	}
	queue := []dir{{p, 1}}
	for len(queue) > 0 {
		if err := ctx.Err(); err != nil {
			return nil, f.s.toRPC(ctx, err, "list directory")
		}
		d := queue[0]
		queue = queue[1:]
		entries, truncated, err := fsys.List(d.p, false, maxListEntries-len(res.Entries)+1)
		if err != nil {
			if d.p == p {
				return nil, f.s.toRPC(ctx, err, "list directory")
			}
			continue // a subdirectory the sandbox's user cannot read, or gone
		}
		if truncated || len(res.Entries)+len(entries) > maxListEntries {
			return nil, rpcError(connect.CodeResourceExhausted, "too_many_entries",
				fmt.Sprintf("%s holds more than %d entries down to depth %d; list with a smaller depth", p, maxListEntries, depth))
		}
		for _, e := range entries {
			res.Entries = append(res.Entries, entryInfo(fsys, o, e))
			if e.Type == "dir" && d.level < depth {
				queue = append(queue, dir{e.Path, d.level + 1})
			}
		}
	}
	return connect.NewResponse(res), nil
}

// Remove removes a file, a symlink or a directory with what it holds.
func (f *fsService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	c, p, fsys, err := f.openAt(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	defer fsys.Close()
	if err := fsys.Remove(p, true); err != nil {
		return nil, f.s.toRPC(ctx, err, "remove")
	}
	c.sess.Audit(ctx, audit.Event{Kind: audit.KindFile, Source: "rest", Op: "remove", Path: p, Result: "ok"})
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}
