package mountinfo

import (
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	line := `36 35 98:0 /mnt1 /mnt\040with\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
	e, ok := Parse(line)
	if !ok {
		t.Fatal("Parse failed")
	}
	want := Entry{Point: "/mnt with space", FSType: "ext3", Source: "/dev/root", SuperOpts: "rw,errors=continue",
		Root: "/mnt1", Dev: "98:0", MountOpts: "rw,noatime", Optional: []string{"master:1"}}
	if !reflect.DeepEqual(e, want) {
		t.Fatalf("Parse = %+v, want %+v", e, want)
	}
	for _, bad := range []string{"", "36 35 98:0 /mnt1 /mnt", "1 2 3 4 5 - ext3"} {
		if _, ok := Parse(bad); ok {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
}
