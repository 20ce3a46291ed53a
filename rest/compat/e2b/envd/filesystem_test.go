package envd_test

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"mime/multipart"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandgate/sandgate/rest/compat/e2b/envd"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/filesystem"
)

// upload writes content to p as the newer SDKs do (octet-stream).
func (sb *sandbox) upload(t *testing.T, p, content string) {
	t.Helper()
	status, _, body := sb.do(t, http.MethodPost, "/files?path="+url.QueryEscape(p)+"&username=user", "application/octet-stream", strings.NewReader(content))
	if status != http.StatusOK {
		t.Fatalf("upload %s: %d %s", p, status, body)
	}
	var infos []struct{ Name, Type, Path string }
	if err := json.Unmarshal([]byte(body), &infos); err != nil || len(infos) != 1 || infos[0].Path != p || infos[0].Type != "file" {
		t.Fatalf("upload %s answered %s", p, body)
	}
}

func (sb *sandbox) download(t *testing.T, p string) (int, string) {
	t.Helper()
	status, _, body := sb.do(t, http.MethodGet, "/files?path="+url.QueryEscape(p)+"&username=user", "", nil)
	return status, body
}

func TestFilesUploadDownload(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	sb := g.newSandbox(t, aliceKey)

	sb.upload(t, "a/b/hello.txt", "hello\n")
	if status, body := sb.download(t, "a/b/hello.txt"); status != http.StatusOK || body != "hello\n" {
		t.Errorf("download: %d %q", status, body)
	}

	// Multipart, as older SDKs and write_files send it: each part's
	// filename is its whole path.
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, f := range []struct{ path, data string }{{"m/one.txt", "1"}, {"m/deep/two.txt", "22"}} {
		pw, _ := mw.CreateFormFile("file", f.path)
		_, _ = pw.Write([]byte(f.data))
	}
	_ = mw.Close()
	status, _, body := sb.do(t, http.MethodPost, "/files", mw.FormDataContentType(), &buf)
	if status != http.StatusOK || !strings.Contains(body, `"path":"m/deep/two.txt"`) {
		t.Fatalf("multipart upload: %d %s", status, body)
	}
	if status, body := sb.download(t, "m/deep/two.txt"); status != http.StatusOK || body != "22" {
		t.Errorf("download: %d %q", status, body)
	}

	// gzip, as write(gzip=True) sends it.
	var zb bytes.Buffer
	zw := gzip.NewWriter(&zb)
	_, _ = zw.Write([]byte("squeezed"))
	_ = zw.Close()
	status, _, body = sb.do(t, http.MethodPost, "/files?path=z.txt", "application/octet-stream", &zb, "Content-Encoding", "gzip")
	if status != http.StatusOK {
		t.Fatalf("gzip upload: %d %s", status, body)
	}
	if _, body := sb.download(t, "z.txt"); body != "squeezed" {
		t.Errorf("gzip upload wrote %q", body)
	}

	for _, tc := range []struct {
		name, method, path, ct string
		hdr                    []string
		status                 int
		reason                 string
	}{
		{"missing file", http.MethodGet, "/files?path=nope.txt", "", nil, http.StatusNotFound, "file_not_found"},
		{"a directory", http.MethodGet, "/files?path=a", "", nil, http.StatusBadRequest, "is_a_directory"},
		{"no path", http.MethodPost, "/files", "application/octet-stream", nil, http.StatusBadRequest, "invalid_path"},
		{"dir path", http.MethodPost, "/files?path=a/", "application/octet-stream", nil, http.StatusBadRequest, "invalid_path"},
		{"metadata", http.MethodPost, "/files?path=x", "application/octet-stream", []string{"X-Metadata-Owner", "me"}, http.StatusBadRequest, "metadata_unsupported"},
		{"not gzip", http.MethodPost, "/files?path=x", "application/octet-stream", []string{"Content-Encoding", "gzip"}, http.StatusBadRequest, "invalid_body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := sb.do(t, tc.method, tc.path, tc.ct, strings.NewReader("data"), tc.hdr...)
			var e struct {
				Code    int
				Message string
				Reason  string
			}
			_ = json.Unmarshal([]byte(body), &e)
			if status != tc.status || e.Code != tc.status || e.Reason != tc.reason || e.Message == "" {
				t.Errorf("%d %s, want %d %s", status, body, tc.status, tc.reason)
			}
		})
	}
}

func TestFilesystemRPCs(t *testing.T) {
	g := newGateway(t, envd.WatchBounds{})
	sb := g.newSandbox(t, aliceKey)
	c := ctx(t)
	sb.upload(t, "docs/readme.md", "# hi\n")

	st, err := sb.fs.Stat(c, connect.NewRequest(&filesystem.StatRequest{Path: "docs/readme.md"}))
	if err != nil {
		t.Fatal(err)
	}
	e := st.Msg.GetEntry()
	if e.GetName() != "readme.md" || e.GetType() != filesystem.FileType_FILE_TYPE_FILE || e.GetSize() != 5 ||
		e.GetPermissions() != "-rw-r--r--" || e.GetMode() != 0o644 || e.GetOwner() == "" || e.GetModifiedTime() == nil {
		t.Errorf("stat %v", e)
	}
	_, err = sb.fs.Stat(c, connect.NewRequest(&filesystem.StatRequest{Path: "docs/missing"}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = sb.fs.Stat(c, connect.NewRequest(&filesystem.StatRequest{Path: ""}))
	wantCode(t, err, connect.CodeInvalidArgument)

	// make_dir: True, then False (already_exists).
	md, err := sb.fs.MakeDir(c, connect.NewRequest(&filesystem.MakeDirRequest{Path: "x/y/z"}))
	if err != nil {
		t.Fatal(err)
	}
	if md.Msg.GetEntry().GetType() != filesystem.FileType_FILE_TYPE_DIRECTORY || md.Msg.GetEntry().GetPermissions()[0] != 'd' {
		t.Errorf("make dir %v", md.Msg.GetEntry())
	}
	_, err = sb.fs.MakeDir(c, connect.NewRequest(&filesystem.MakeDirRequest{Path: "x/y/z"}))
	wantCode(t, err, connect.CodeAlreadyExists)

	// A symlink has its target's type and says it is one.
	run := func(cmd string) {
		t.Helper()
		stream, r := sb.start(t, c, bash(cmd, false))
		wait(t, stream, r)
		if r.end.GetExitCode() != 0 {
			t.Fatalf("%s: %v %s", cmd, r.end, r.stderr.String())
		}
	}
	run("ln -s readme.md docs/link.md")
	st, err = sb.fs.Stat(c, connect.NewRequest(&filesystem.StatRequest{Path: "docs/link.md"}))
	if err != nil {
		t.Fatal(err)
	}
	if e := st.Msg.GetEntry(); !e.GetIsSymlink() || e.GetSymlinkTarget() != "readme.md" || e.GetType() != filesystem.FileType_FILE_TYPE_FILE {
		t.Errorf("symlink stat %v", e)
	}

	// ListDir, by depth.
	names := func(depth uint32) []string {
		t.Helper()
		ls, err := sb.fs.ListDir(c, connect.NewRequest(&filesystem.ListDirRequest{Path: "x", Depth: depth}))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ls.Msg.GetEntries() {
			out = append(out, e.GetPath())
		}
		return out
	}
	if got := names(1); !slices.Equal(got, []string{"x/y"}) {
		t.Errorf("depth 1: %v", got)
	}
	if got := names(0); !slices.Equal(got, []string{"x/y"}) {
		t.Errorf("depth 0: %v", got)
	}
	if got := names(3); !slices.Equal(got, []string{"x/y", "x/y/z"}) {
		t.Errorf("depth 3: %v", got)
	}
	_, err = sb.fs.ListDir(c, connect.NewRequest(&filesystem.ListDirRequest{Path: "docs/readme.md"}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = sb.fs.ListDir(c, connect.NewRequest(&filesystem.ListDirRequest{Path: "nowhere"}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = sb.fs.ListDir(c, connect.NewRequest(&filesystem.ListDirRequest{Path: "x", Depth: 1000}))
	wantCode(t, err, connect.CodeInvalidArgument)

	// rename into a directory that does not exist yet.
	mv, err := sb.fs.Move(c, connect.NewRequest(&filesystem.MoveRequest{Source: "docs/readme.md", Destination: "moved/README"}))
	if err != nil {
		t.Fatal(err)
	}
	if mv.Msg.GetEntry().GetPath() != "moved/README" || mv.Msg.GetEntry().GetSize() != 5 {
		t.Errorf("move %v", mv.Msg.GetEntry())
	}
	if status, body := sb.download(t, "moved/README"); status != http.StatusOK || body != "# hi\n" {
		t.Errorf("moved file: %d %q", status, body)
	}
	_, err = sb.fs.Move(c, connect.NewRequest(&filesystem.MoveRequest{Source: "docs/readme.md", Destination: "again"}))
	wantCode(t, err, connect.CodeNotFound)

	// remove: a file, then a tree.
	if _, err := sb.fs.Remove(c, connect.NewRequest(&filesystem.RemoveRequest{Path: "moved/README"})); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.fs.Remove(c, connect.NewRequest(&filesystem.RemoveRequest{Path: "x"})); err != nil {
		t.Fatal(err)
	}
	_, err = sb.fs.Stat(c, connect.NewRequest(&filesystem.StatRequest{Path: "x/y"}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = sb.fs.Remove(c, connect.NewRequest(&filesystem.RemoveRequest{Path: "x"}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = sb.fs.Remove(c, connect.NewRequest(&filesystem.RemoveRequest{Path: "."}))
	wantCode(t, err, connect.CodeInvalidArgument)
}
