package compat

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/dataplane"
)

// Issue 39 item 3: inputs as seed 001's users send them, absolute paths
// (its README's example) too, are paths of the workspace.
func TestAgentInputPath(t *testing.T) {
	for in, want := range map[string]string{
		"/path/to/input1.py":  "path/to/input1.py",
		"/path/to/input2.txt": "path/to/input2.txt",
		"data.csv":            "data.csv",
		"./data.csv":          "data.csv",
		"/work/data.csv":      "data.csv",
		"/workspace/a/b.txt":  "a/b.txt",
		`\work\x.txt`:         "x.txt",
		"//etc//passwd":       "etc/passwd",
		"/workspace":          "workspace",
	} {
		if got, err := agentInputPath(in); err != nil || got != want {
			t.Errorf("agentInputPath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "/", "/..", "/work/../x", "a/../../b", "../x"} {
		if got, err := agentInputPath(in); err == nil {
			t.Errorf("agentInputPath(%q) = %q, want an error", in, got)
		}
	}
}

// memStore is an ObjectStore in memory, for the store's bookkeeping.
type memStore struct {
	mu   sync.Mutex
	objs map[string]string
}

func (m *memStore) Put(_ context.Context, key string, r io.Reader, _ int64) error {
	b, err := io.ReadAll(r)
	m.mu.Lock()
	m.objs[key] = string(b)
	m.mu.Unlock()
	return err
}

func (m *memStore) Get(_ context.Context, key string) (io.ReadCloser, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.objs[key]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return io.NopCloser(strings.NewReader(v)), nil
}

func (m *memStore) List(_ context.Context, prefix string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for k := range m.objs {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out, nil
}

func (m *memStore) Delete(_ context.Context, key string) error {
	m.mu.Lock()
	delete(m.objs, key)
	m.mu.Unlock()
	return nil
}

func (m *memStore) PresignGet(context.Context, string, time.Duration, url.Values) (string, error) {
	return "", errors.New("no presign")
}

// A cleanup of a prefix (an ended sandbox's) leaves a live sandbox of the
// same prefix holding nothing stored, so that its next push uploads its
// files again rather than trusting objects that are gone; a session of
// another prefix keeps its record.
func TestAgentStoreCleanupResetsLiveRecords(t *testing.T) {
	ms := &memStore{objs: map[string]string{"p/a.txt": "a", "q/b.txt": "b"}}
	st := newAgentStore(AgentSandboxConfig{Store: ms, Prefix: "p", DeleteOnCleanup: true}, 0, slog.New(slog.DiscardHandler))
	stamp := fileStamp{size: 1, mtime: time.Unix(1, 0)}
	st.pushed["live"] = &pushRecord{pfx: "p/", files: map[string]fileStamp{"a.txt": stamp}}
	st.pushed["other"] = &pushRecord{pfx: "q/", files: map[string]fileStamp{"b.txt": stamp}}
	st.cleanup(context.Background(), "p/")
	if _, ok := ms.objs["p/a.txt"]; ok {
		t.Fatal("p/a.txt not deleted")
	}
	if n := len(st.pushed["live"].files); n != 0 {
		t.Errorf("the live session of the cleaned prefix still counts %d files stored", n)
	}
	if n := len(st.pushed["other"].files); n != 1 {
		t.Errorf("the session of another prefix counts %d files stored, want 1", n)
	}
}

// agentInputPath never yields a path that leaves the workspace: what it
// accepts is relative, clean (no empty, "." or ".." segment), and a path
// the files engine takes.
func FuzzAgentInputPath(f *testing.F) {
	for _, s := range []string{"/path/to/input1.py", "data.csv", "./data.csv", "/work/data.csv", "/workspace/a/b.txt",
		`\\work\\x.txt`, "//etc//passwd", "/workspace", "/..", "/work/../x", "a/../../b", "../x", "a/./b", " /work/ ", "/work/..",
		"a\\..\\b", "/w\x00rk", "é/ü.txt", "/work//workspace/x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := agentInputPath(in)
		if err != nil {
			return
		}
		if got == "" || strings.HasPrefix(got, "/") || strings.Contains(got, `\\`) {
			t.Fatalf("agentInputPath(%q) = %q: not a relative path", in, got)
		}
		for _, seg := range strings.Split(got, "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Fatalf("agentInputPath(%q) = %q: segment %q", in, got, seg)
			}
		}
		if path.Clean(got) != got {
			t.Fatalf("agentInputPath(%q) = %q: not clean", in, got)
		}
		if _, err := dataplane.CheckPath(got); err != nil {
			t.Fatalf("agentInputPath(%q) = %q, which the files engine refuses: %v", in, got, err)
		}
	})
}
