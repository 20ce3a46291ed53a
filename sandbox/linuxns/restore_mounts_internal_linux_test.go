//go:build linux

package linuxns

import (
	"strings"
	"testing"
)

// compareMounts: ids and device numbers are not compared, but for the
// workspace's, which must be the restored sandbox's own; anything a mount
// exposes, or how, is.
func TestCompareMounts(t *testing.T) {
	parse := func(lines ...string) []mountRec {
		var out []mountRec
		for _, l := range lines {
			m, err := parseMountLine(l)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, m)
		}
		return out
	}
	const (
		root = "10 9 0:40 / / ro,nosuid,nodev,relatime - tmpfs tmpfs rw,size=1024k"
		usr  = "11 10 254:0 /usr /usr ro,nosuid,nodev,relatime - ext4 /dev/vda rw"
		ws   = "12 10 7:0 / /workspace rw,nosuid,nodev,noatime - ext4 /dev/loop0 rw"
		dev  = "13 10 0:6 /null /dev/null rw,relatime - devtmpfs devtmpfs rw"
	)
	want := parse(root, usr, ws, dev)
	for _, tc := range []struct {
		name  string
		got   []string
		wsDev string
		err   string
	}{
		{"the same", []string{root, usr, ws, dev}, "7:0", ""},
		{"new ids, devices, loop device, order", []string{
			"501 500 0:77 / / ro,nosuid,nodev,relatime - tmpfs tmpfs rw,size=1024k,uid=5",
			"505 501 7:3 / /workspace rw,nosuid,nodev,noatime - ext4 /dev/loop3 rw",
			"502 501 254:0 /usr /usr ro,nosuid,nodev,relatime,noexec - ext4 /dev/vda rw",
			"509 501 0:6 /null /dev/null rw,relatime - devtmpfs devtmpfs rw"}, "7:3", ""},
		{"a host dir added", []string{root, usr, ws, dev, "14 12 254:0 /usr /workspace/x rw,relatime - ext4 /dev/vda rw"}, "7:0", "a mount at /workspace/x"},
		{"ro lost", []string{root, strings.Replace(usr, "ro,nosuid", "rw,nosuid", 1), ws, dev}, "7:0", "the mount at /usr"},
		{"another root", []string{root, strings.Replace(usr, "/usr /usr", "/ /usr", 1), ws, dev}, "7:0", "the mount at /usr"},
		{"another source", []string{root, usr, ws, strings.Replace(dev, "devtmpfs devtmpfs", "devtmpfs /dev/sda1", 1)}, "7:0", "the mount at /dev/null"},
		{"another fs type", []string{root, usr, ws, strings.Replace(dev, "devtmpfs devtmpfs", "ext4 devtmpfs", 1)}, "7:0", "the mount at /dev/null"},
		{"a slave of a host mount", []string{root, strings.Replace(usr, "relatime -", "relatime master:7 -", 1), ws, dev}, "7:0", "the mount at /usr"},
		{"another workspace", []string{root, usr, ws, dev}, "7:1", "the mount at /workspace"},
		{"one missing", []string{root, usr, ws}, "7:0", "mount at /dev/null (devtmpfs) is missing"},
		{"a second at a point", []string{root, usr, ws, dev, dev}, "7:0", "a mount at /dev/null"},
	} {
		err := compareMounts(parse(tc.got...), want, tc.wsDev)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.err)
		}
	}
	if got := parse("1 0 0:5 / /x rw - ext4 /dev/vda ro")[0].Flags; got != "ro" {
		t.Errorf("a read-only superblock: flags %q, want ro", got)
	}
	if got := parse("1 0 0:5 / /x rw shared:3 master:1 - ext4 /dev/vda rw")[0].Propagation; got != "master,shared" {
		t.Errorf("a shared slave: propagation %q", got)
	}
}
