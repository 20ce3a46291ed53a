package images

import (
	"archive/tar"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sandgate/sandgate/images/imagestest"
)

// These tests need root (mknod, trusted.* xattrs, chown): they run as root
// in CI and fail, rather than skip, without it.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (mknod, trusted xattrs, chown); run the suite as root")
	}
}

var testLimits = Limits{MaxLayerBytes: 1 << 30, MaxLayerEntries: 10000, MaxLayers: 16}

// unpackTar unpacks entries into a fresh dir beside an "outside" dir that
// holds a file "secret"; it returns the layer dir, the outside dir and
// unpack's error.
func unpackTar(t *testing.T, lim Limits, entries ...imagestest.Entry) (layer, outside string, err error) {
	t.Helper()
	return unpackTarAt(t, t.TempDir(), lim, entries)
}

// unpackTarAt is unpackTar in a given base dir, so entries can name the
// outside dir before it exists.
func unpackTarAt(t *testing.T, base string, lim Limits, entries []imagestest.Entry) (layer, outside string, err error) {
	t.Helper()
	layer = filepath.Join(base, "layer")
	outside = filepath.Join(base, "outside")
	for _, d := range []string{layer, outside} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = unpack(bytes.NewReader(imagestest.Tar(t, entries...)), layer, lim)
	return layer, outside, err
}

// outsideUntouched checks that the outside dir still holds only "secret",
// unchanged, with no xattrs.
func outsideUntouched(t *testing.T, outside string) {
	t.Helper()
	ents, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"secret"}) {
		t.Errorf("outside dir now holds %v, want only [secret]", names)
	}
	b, err := os.ReadFile(filepath.Join(outside, "secret"))
	if err != nil || string(b) != "secret" {
		t.Errorf("outside/secret = %q, %v; want it unchanged", b, err)
	}
	fi, _ := os.Stat(filepath.Join(outside, "secret"))
	if fi != nil && fi.Mode().Perm() != 0o644 {
		t.Errorf("outside/secret mode = %v, want 0644", fi.Mode())
	}
	if sz, _ := unix.Listxattr(outside, nil); sz > 0 {
		t.Errorf("outside dir got xattrs")
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(outside), "pwned")); err == nil {
		t.Errorf("a file was written beside the layer dir")
	}
}

func TestUnpackWhiteoutsInOverlayForm_Root(t *testing.T) {
	requireRoot(t)
	layer, _, err := unpackTar(t, testLimits,
		imagestest.Entry{Name: "etc/", Type: tar.TypeDir},
		imagestest.Entry{Name: "etc/.wh.passwd", Body: ""},
		imagestest.Entry{Name: "var/lib/.wh..wh..opq"},
		imagestest.Entry{Name: "var/lib/kept", Body: "k"},
		imagestest.Entry{Name: ".wh..wh.plnk"},
		imagestest.Entry{Name: ".wh.both"},
		imagestest.Entry{Name: "both", Body: "this layer's own file wins"},
		imagestest.Entry{Name: "mine", Body: "x"},
		imagestest.Entry{Name: ".wh.mine"},
	)
	if err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(layer, "etc/passwd"), &st); err != nil {
		t.Fatalf("whiteout etc/passwd: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("etc/passwd: mode %o rdev %d uid %d gid %d, want a 0:0 char device owned by root", st.Mode, st.Rdev, st.Uid, st.Gid)
	}
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(filepath.Join(layer, "var/lib"), "trusted.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Errorf("var/lib trusted.overlay.opaque = %q, %v; want y", buf[:n], err)
	}
	if b, _ := os.ReadFile(filepath.Join(layer, "var/lib/kept")); string(b) != "k" {
		t.Errorf("var/lib/kept = %q", b)
	}
	for _, name := range []string{".wh..wh.plnk", ".wh.both", "etc/.wh.passwd", "var/lib/.wh..wh..opq"} {
		if _, err := os.Lstat(filepath.Join(layer, name)); err == nil {
			t.Errorf("%s is in the layer, want it converted or dropped", name)
		}
	}
	for name, want := range map[string]string{"both": "this layer's own file wins", "mine": "x"} {
		if b, err := os.ReadFile(filepath.Join(layer, name)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; a whiteout must not hide its own layer's file", name, b, err)
		}
	}
}

func TestUnpackHostileLayers_Root(t *testing.T) {
	requireRoot(t)
	type check func(t *testing.T, layer, outside string)
	noFile := func(rel string) check {
		return func(t *testing.T, layer, _ string) {
			if _, err := os.Lstat(filepath.Join(layer, rel)); err == nil {
				t.Errorf("%s exists in the layer", rel)
			}
		}
	}
	cases := []struct {
		name    string
		entries func(outside string) []imagestest.Entry
		wantErr string // "" for a layer that unpacks
		check   check
	}{
		{
			name: "dotdot path",
			entries: func(string) []imagestest.Entry {
				return []imagestest.Entry{{Name: "../pwned", Body: "x"}}
			},
			wantErr: "leaves the layer",
		},
		{
			name: "dotdot deep path",
			entries: func(string) []imagestest.Entry {
				return []imagestest.Entry{{Name: "a/b/../../../outside/pwned", Body: "x"}}
			},
			wantErr: "leaves the layer",
		},
		{
			name: "absolute path lands inside the layer",
			entries: func(outside string) []imagestest.Entry {
				return []imagestest.Entry{{Name: outside + "/pwned", Body: "x"}}
			},
			check: func(t *testing.T, layer, outside string) {
				if b, err := os.ReadFile(filepath.Join(layer, outside, "pwned")); err != nil || string(b) != "x" {
					t.Errorf("absolute entry not inside the layer: %q, %v", b, err)
				}
			},
		},
		{
			name: "write through an absolute symlink out of the layer",
			entries: func(outside string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "link", Type: tar.TypeSymlink, Linkname: outside},
					{Name: "link/pwned", Body: "x"},
				}
			},
			wantErr: "escapes",
		},
		{
			name: "write through a relative symlink out of the layer",
			entries: func(string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "d/", Type: tar.TypeDir},
					{Name: "d/link", Type: tar.TypeSymlink, Linkname: "../../outside"},
					{Name: "d/link/pwned", Body: "x"},
				}
			},
			wantErr: "escapes",
		},
		{
			name: "directory through a symlink out of the layer",
			entries: func(outside string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "link", Type: tar.TypeSymlink, Linkname: outside},
					{Name: "link/newdir/", Type: tar.TypeDir},
				}
			},
			wantErr: "escapes",
		},
		{
			name: "symlink created through a symlink out of the layer",
			entries: func(outside string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "link", Type: tar.TypeSymlink, Linkname: outside},
					{Name: "link/pwned", Type: tar.TypeSymlink, Linkname: "/etc/shadow"},
				}
			},
			wantErr: "escapes",
		},
		{
			name: "a file replaces a symlink instead of writing through it",
			entries: func(outside string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "f", Type: tar.TypeSymlink, Linkname: outside + "/secret"},
					{Name: "f", Body: "overwritten?", Mode: 0o777},
				}
			},
			check: func(t *testing.T, layer, _ string) {
				fi, err := os.Lstat(filepath.Join(layer, "f"))
				if err != nil || !fi.Mode().IsRegular() {
					t.Errorf("f = %v, %v; want a regular file in the layer", fi, err)
				}
			},
		},
		{
			name: "symlinks out of the layer are kept as symlinks",
			entries: func(outside string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "abs", Type: tar.TypeSymlink, Linkname: outside + "/secret"},
					{Name: "rel", Type: tar.TypeSymlink, Linkname: "../../../../outside/secret"},
				}
			},
			check: func(t *testing.T, layer, outside string) {
				if got, _ := os.Readlink(filepath.Join(layer, "abs")); got != outside+"/secret" {
					t.Errorf("abs -> %q", got)
				}
			},
		},
		{
			name: "hard link to an absolute path outside",
			entries: func(outside string) []imagestest.Entry {
				return []imagestest.Entry{{Name: "hl", Type: tar.TypeLink, Linkname: outside + "/secret"}}
			},
			wantErr: "not in this layer",
		},
		{
			name: "hard link with dotdot",
			entries: func(string) []imagestest.Entry {
				return []imagestest.Entry{{Name: "hl", Type: tar.TypeLink, Linkname: "../outside/secret"}}
			},
			wantErr: "leaves the layer",
		},
		{
			name: "hard link through a symlink out of the layer",
			entries: func(outside string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "link", Type: tar.TypeSymlink, Linkname: outside},
					{Name: "hl", Type: tar.TypeLink, Linkname: "link/secret"},
				}
			},
			wantErr: "escapes",
		},
		{
			name: "hard link created through a symlink out of the layer",
			entries: func(outside string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "file", Body: "x"},
					{Name: "link", Type: tar.TypeSymlink, Linkname: outside},
					{Name: "link/pwned", Type: tar.TypeLink, Linkname: "file"},
				}
			},
			wantErr: "escapes",
		},
		{
			name: "hard link to a symlink links the symlink itself",
			entries: func(outside string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "link", Type: tar.TypeSymlink, Linkname: outside + "/secret"},
					{Name: "hl", Type: tar.TypeLink, Linkname: "link"},
				}
			},
			check: func(t *testing.T, layer, outside string) {
				fi, err := os.Lstat(filepath.Join(layer, "hl"))
				if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
					t.Errorf("hl = %v, %v; want the symlink hard-linked", fi, err)
				}
			},
		},
		{
			name: "whiteout through a symlink out of the layer",
			entries: func(outside string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "link", Type: tar.TypeSymlink, Linkname: outside},
					{Name: "link/.wh.secret"},
				}
			},
			wantErr: "escapes",
		},
		{
			name: "opaque marker through a symlink out of the layer",
			entries: func(outside string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "link", Type: tar.TypeSymlink, Linkname: outside},
					{Name: "link/.wh..wh..opq"},
				}
			},
			wantErr: "escapes",
		},
		{
			name: "device nodes and FIFOs are skipped",
			entries: func(string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "null", Type: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666},
					{Name: "sda", Type: tar.TypeBlock, Devmajor: 8, Devminor: 0, Mode: 0o666},
					{Name: "fifo", Type: tar.TypeFifo, Mode: 0o666},
					{Name: "hl-null", Type: tar.TypeLink, Linkname: "null"},
					{Name: "kept", Body: "k"},
				}
			},
			check: func(t *testing.T, layer, outside string) {
				for _, n := range []string{"null", "sda", "fifo", "hl-null"} {
					noFile(n)(t, layer, outside)
				}
			},
		},
		{
			name: "setuid and setgid bits are stripped",
			entries: func(string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "suid", Body: "#!/bin/sh\n", Mode: 0o4755},
					{Name: "sgid", Body: "#!/bin/sh\n", Mode: 0o2755},
					{Name: "hl-suid", Type: tar.TypeLink, Linkname: "suid"},
					{Name: "dir/", Type: tar.TypeDir, Mode: 0o6775},
					{Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777},
				}
			},
			check: func(t *testing.T, layer, _ string) {
				for name, want := range map[string]uint32{
					"suid": 0o755, "sgid": 0o755, "hl-suid": 0o755,
					"dir": 0o2775, // setgid on a directory only sets the group of new files
					"tmp": 0o1777,
				} {
					var st unix.Stat_t
					if err := unix.Lstat(filepath.Join(layer, name), &st); err != nil {
						t.Errorf("%s: %v", name, err)
						continue
					}
					if got := st.Mode & 0o7777; got != want {
						t.Errorf("%s mode %04o, want %04o", name, got, want)
					}
				}
			},
		},
		{
			name: "only user xattrs are kept",
			entries: func(string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "f", Body: "x", PAX: map[string]string{
						"SCHILY.xattr.user.note":                   "kept",
						"SCHILY.xattr.security.capability":         "\x01\x00\x00\x02\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00",
						"SCHILY.xattr.trusted.overlay.redirect":    "/etc",
						"SCHILY.xattr.trusted.overlay.opaque":      "y",
						"SCHILY.xattr.system.posix_acl_access":     "\x02\x00\x00\x00",
						"SCHILY.xattr.security.selinux":            "system_u:object_r:etc_t:s0",
						"SCHILY.xattr.trusted.overlay.metacopy":    "",
						"SCHILY.xattr.user.another":                "v",
						"SCHILY.xattr.security.evm":                "x",
						"SCHILY.xattr.trusted.overlay.origin":      "x",
						"SCHILY.xattr.system.posix_acl_default":    "\x02\x00\x00\x00",
						"SCHILY.xattr.trusted.overlay.upper":       "x",
						"SCHILY.xattr.trusted.overlay.nlink":       "x",
						"SCHILY.xattr.trusted.overlay.impure":      "y",
						"SCHILY.xattr.security.ima":                "x",
						"SCHILY.xattr.trusted.overlay.protattr":    "x",
						"SCHILY.xattr.trusted.overlay.uuid":        "x",
						"SCHILY.xattr.trusted.overlay.whiteout":    "x",
						"SCHILY.xattr.trusted.overlay.whiteouts":   "x",
						"SCHILY.xattr.trusted.overlay.verity":      "x",
						"SCHILY.xattr.trusted.overlay.xwhiteout":   "x",
						"SCHILY.xattr.trusted.overlay.xwhiteouts":  "x",
						"SCHILY.xattr.trusted.overlay.opaque.more": "x",
						"SCHILY.xattr.user.overlay.redirect":       "/etc",
						"SCHILY.xattr.user.overlay.opaque":         "y",
					}},
					{Name: "d/", Type: tar.TypeDir, PAX: map[string]string{
						"SCHILY.xattr.user.dir":               "yes",
						"SCHILY.xattr.trusted.overlay.opaque": "y",
					}},
				}
			},
			check: func(t *testing.T, layer, _ string) {
				for name, want := range map[string][]string{"f": {"user.another", "user.note"}, "d": {"user.dir"}} {
					got := listXattrs(t, filepath.Join(layer, name))
					if !slices.Equal(got, want) {
						t.Errorf("%s xattrs = %v, want %v", name, got, want)
					}
				}
			},
		},
		{
			name: "owners: image ids kept, ids above 65535 become 65534",
			entries: func(string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "mine", Body: "x", UID: 1000, GID: 1000},
					{Name: "big", Body: "x", UID: 70000, GID: 1 << 30},
					{Name: "dir/", Type: tar.TypeDir, UID: 33, GID: 33},
					{Name: "sym", Type: tar.TypeSymlink, Linkname: "mine", UID: 7, GID: 8},
				}
			},
			check: func(t *testing.T, layer, _ string) {
				for name, want := range map[string][2]uint32{"mine": {1000, 1000}, "big": {65534, 65534}, "dir": {33, 33}, "sym": {7, 8}} {
					var st unix.Stat_t
					if err := unix.Lstat(filepath.Join(layer, name), &st); err != nil {
						t.Fatal(err)
					}
					if st.Uid != want[0] || st.Gid != want[1] {
						t.Errorf("%s owned by %d:%d, want %d:%d", name, st.Uid, st.Gid, want[0], want[1])
					}
				}
			},
		},
		{
			name: "root entry and nested hard link",
			entries: func(string) []imagestest.Entry {
				return []imagestest.Entry{
					{Name: "./", Type: tar.TypeDir, Mode: 0o755},
					{Name: "./usr/bin/prog", Body: "bin", Mode: 0o755},
					{Name: "./usr/bin/alias", Type: tar.TypeLink, Linkname: "./usr/bin/prog"},
				}
			},
			check: func(t *testing.T, layer, _ string) {
				var a, b syscall.Stat_t
				syscall.Stat(filepath.Join(layer, "usr/bin/prog"), &a)
				syscall.Stat(filepath.Join(layer, "usr/bin/alias"), &b)
				if a.Ino == 0 || a.Ino != b.Ino || a.Nlink != 2 {
					t.Errorf("alias is not a hard link of prog: ino %d/%d nlink %d", a.Ino, b.Ino, a.Nlink)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			outside := filepath.Join(base, "outside")
			layer, _, err := unpackTarAt(t, base, testLimits, tc.entries(outside))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("unpack error = %v, want one containing %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("unpack: %v", err)
			}
			outsideUntouched(t, outside)
			if tc.check != nil {
				tc.check(t, layer, outside)
			}
		})
	}
}

func listXattrs(t *testing.T, p string) []string {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range strings.Split(string(buf[:n]), "\x00") {
		if s != "" {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}

func TestUnpackBounds(t *testing.T) {
	many := make([]imagestest.Entry, 0, 20)
	for i := range 20 {
		many = append(many, imagestest.Entry{Name: "f" + string(rune('a'+i)), Body: "x"})
	}
	_, _, err := unpackTar(t, Limits{MaxLayerBytes: 1 << 20, MaxLayerEntries: 10}, many...)
	if err == nil || !strings.Contains(err.Error(), "more than 10 entries") {
		t.Errorf("20 entries with a limit of 10: %v", err)
	}
	_, _, err = unpackTar(t, Limits{MaxLayerBytes: 1000, MaxLayerEntries: 10}, imagestest.Entry{Name: "big", Body: strings.Repeat("x", 2000)})
	if err == nil || !strings.Contains(err.Error(), "larger than the limit") {
		t.Errorf("a 2000-byte file with a limit of 1000: %v", err)
	}
	_, _, err = unpackTar(t, Limits{MaxLayerBytes: 1000, MaxLayerEntries: 10},
		imagestest.Entry{Name: "a", Body: strings.Repeat("x", 600)}, imagestest.Entry{Name: "b", Body: strings.Repeat("x", 600)})
	if err == nil || !strings.Contains(err.Error(), "larger than the limit") {
		t.Errorf("two 600-byte files with a limit of 1000: %v", err)
	}
}

func TestCleanPath(t *testing.T) {
	for in, want := range map[string]string{
		"a/b": "a/b", "./a/": "a", "/etc/passwd": "etc/passwd", "/": ".", "./": ".",
		"a/../b": "b", "/../x": "x", "a//b": "a/b",
	} {
		if got, err := cleanPath(in); err != nil || got != want {
			t.Errorf("cleanPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"..", "../x", "a/../../x", "", "a\x00b"} {
		if got, err := cleanPath(in); err == nil {
			t.Errorf("cleanPath(%q) = %q, want an error", in, got)
		}
	}
}
