package gwtest

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// Browser is a headless Chromium driven over the DevTools protocol on a
// pipe (--remote-debugging-pipe: commands on its fd 3, answers on its
// fd 4, each JSON message ended by a NUL byte), so the tests need no
// WebSocket client and no port. One profile for its whole life: what a
// page leaves in it (service workers, cookies, storage) is there for the
// pages opened after it, as in a user's browser.
type Browser struct {
	cmd  *exec.Cmd
	in   *os.File // our end of the browser's fd 3
	out  *os.File // our end of the browser's fd 4
	done chan struct{}

	mu      sync.Mutex
	next    int
	waiting map[int]chan cdpAnswer
	readErr error
}

type cdpAnswer struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// Page is a browser tab.
type Page struct {
	b       *Browser
	session string
}

// RequireBrowser returns the path of a headless Chromium (Debian's
// chromium-headless-shell or chromium), skipping the test without one,
// or failing it under CI=true (.ci/run installs one).
func RequireBrowser(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium-headless-shell", "chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("a headless Chromium (chromium-headless-shell) is required in CI (.ci/run installs it)")
	}
	t.Skip("no headless Chromium installed (apt-get install chromium-headless-shell)")
	return ""
}

// StartBrowser starts the browser at path with a fresh profile; it ends
// with the test.
func StartBrowser(t testing.TB, path string) *Browser {
	t.Helper()
	cmdR, cmdW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	resR, resW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--headless", "--remote-debugging-pipe", "--user-data-dir=" + t.TempDir(),
		"--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-dev-shm-usage",
		"--disable-extensions", "--disable-background-networking", "--disable-sync", "--no-proxy-server",
		"--password-store=basic", "--use-mock-keychain", "about:blank"}
	if os.Geteuid() == 0 {
		args = append(args, "--no-sandbox") // Chromium's own sandbox refuses root
	}
	cmd := exec.Command(path, args...)
	cmd.ExtraFiles = []*os.File{cmdR, resW}
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	cmdR.Close()
	resW.Close()
	b := &Browser{cmd: cmd, in: cmdW, out: resR, done: make(chan struct{}), waiting: map[int]chan cdpAnswer{}}
	go b.read()
	t.Cleanup(func() {
		b.in.Close()
		_ = b.cmd.Process.Kill()
		_ = b.cmd.Wait()
		<-b.done
		b.out.Close()
		if t.Failed() {
			t.Logf("browser output:\n%s", logs.String())
		}
	})
	return b
}

// read dispatches answers to their callers; events are dropped.
func (b *Browser) read() {
	defer close(b.done)
	r := bufio.NewReaderSize(b.out, 1<<20)
	for {
		msg, err := r.ReadBytes(0)
		if err != nil {
			b.mu.Lock()
			b.readErr = fmt.Errorf("the browser's pipe: %w", err)
			for id, ch := range b.waiting {
				close(ch)
				delete(b.waiting, id)
			}
			b.mu.Unlock()
			return
		}
		var m struct {
			ID int `json:"id"`
			cdpAnswer
		}
		if json.Unmarshal(msg[:len(msg)-1], &m) != nil || m.ID == 0 {
			continue
		}
		b.mu.Lock()
		ch := b.waiting[m.ID]
		delete(b.waiting, m.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- m.cdpAnswer
		}
	}
}

// call sends method with params (in session, "" for the browser) and
// decodes the result into out (nil: dropped).
func (b *Browser) call(ctx context.Context, session, method string, params, out any) error {
	b.mu.Lock()
	if b.readErr != nil {
		b.mu.Unlock()
		return b.readErr
	}
	b.next++
	id := b.next
	ch := make(chan cdpAnswer, 1)
	b.waiting[id] = ch
	b.mu.Unlock()
	msg := map[string]any{"id": id, "method": method, "params": params}
	if session != "" {
		msg["sessionId"] = session
	}
	data, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	if _, err := b.in.Write(append(data, 0)); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	select {
	case a, ok := <-ch:
		if !ok {
			return fmt.Errorf("%s: the browser went away", method)
		}
		if a.Error != nil {
			return fmt.Errorf("%s: %s", method, a.Error.Message)
		}
		if out != nil {
			return json.Unmarshal(a.Result, out)
		}
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		delete(b.waiting, id)
		b.mu.Unlock()
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

// NewPage opens a tab on about:blank, with downloads refused (a file
// link's attachment goes nowhere).
func (b *Browser) NewPage(t testing.TB) *Page {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var target struct{ TargetID string }
	if err := b.call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &target); err != nil {
		t.Fatal(err)
	}
	var att struct{ SessionID string }
	if err := b.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att); err != nil {
		t.Fatal(err)
	}
	if err := b.call(ctx, "", "Browser.setDownloadBehavior", map[string]any{"behavior": "deny"}, nil); err != nil {
		t.Fatal(err)
	}
	return &Page{b: b, session: att.SessionID}
}

// Navigate loads url in the page and waits until its document is
// complete; it returns the browser's error text ("" when the page
// loaded; net::ERR_ABORTED for a download).
func (p *Page) Navigate(t testing.TB, url string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var nav struct{ ErrorText string }
	if err := p.b.call(ctx, p.session, "Page.navigate", map[string]any{"url": url}, &nav); err != nil {
		t.Fatal(err)
	}
	if nav.ErrorText != "" {
		return nav.ErrorText
	}
	for {
		var state string
		if err := p.eval(ctx, `document.readyState`, &state); err == nil && state == "complete" {
			return ""
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s never finished loading", url)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Eval runs expr in the page, awaiting it if it is a promise, and
// returns its value as JSON-decoded into out.
func (p *Page) Eval(t testing.TB, expr string, out any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.eval(ctx, expr, out); err != nil {
		t.Fatalf("eval %.80q: %v", expr, err)
	}
}

func (p *Page) eval(ctx context.Context, expr string, out any) error {
	var res struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception *struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
	}
	if err := p.b.call(ctx, p.session, "Runtime.evaluate",
		map[string]any{"expression": expr, "awaitPromise": true, "returnByValue": true}, &res); err != nil {
		return err
	}
	if e := res.ExceptionDetails; e != nil {
		msg := e.Text
		if e.Exception != nil {
			msg += " " + e.Exception.Description
		}
		return errors.New(msg)
	}
	if out == nil || len(res.Result.Value) == 0 {
		return nil
	}
	return json.Unmarshal(res.Result.Value, out)
}

// syncBuffer collects the browser's output for a failing test's log.
type syncBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.buf) < 1<<20 {
		s.buf = append(s.buf, p...)
	}
	return len(p), nil
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(s.buf)
}

// callPage sends method with params in the page's session, within a
// minute, failing t on an error.
func (p *Page) callPage(t testing.TB, method string, params, out any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.b.call(ctx, p.session, method, params, out); err != nil {
		t.Fatal(err)
	}
}

// AddInitScript runs source in every document the page loads from now
// on, before the document's own scripts (what a page's CSP does not
// govern: the test's own probes).
func (p *Page) AddInitScript(t testing.TB, source string) {
	t.Helper()
	p.callPage(t, "Page.enable", map[string]any{}, nil)
	p.callPage(t, "Page.addScriptToEvaluateOnNewDocument", map[string]any{"source": source}, nil)
}

// SetViewport sets the page's window to width x height CSS pixels; the
// page sees a resize.
func (p *Page) SetViewport(t testing.TB, width, height int) {
	t.Helper()
	p.callPage(t, "Emulation.setDeviceMetricsOverride",
		map[string]any{"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}, nil)
}

// Screenshot saves the page's viewport as a PNG at path.
func (p *Page) Screenshot(t testing.TB, path string) {
	t.Helper()
	var shot struct{ Data string }
	p.callPage(t, "Page.captureScreenshot", map[string]any{"format": "png"}, &shot)
	data, err := base64.StdEncoding.DecodeString(shot.Data)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Type sends text as key presses to the focused element, as a keyboard
// would: each character a keyDown (with its text) and a keyUp; "\r" is
// the Enter key, "\t" the Tab key.
func (p *Page) Type(t testing.TB, text string) {
	t.Helper()
	for _, r := range text {
		down := map[string]any{"type": "keyDown", "text": string(r), "unmodifiedText": string(r), "key": string(r)}
		switch r {
		case '\r':
			down = map[string]any{"type": "keyDown", "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "text": "\r"}
		case '\t':
			down = map[string]any{"type": "keyDown", "key": "Tab", "code": "Tab", "windowsVirtualKeyCode": 9}
		}
		p.callPage(t, "Input.dispatchKeyEvent", down, nil)
		up := map[string]any{"type": "keyUp", "key": down["key"]}
		if c, ok := down["code"]; ok {
			up["code"], up["windowsVirtualKeyCode"] = c, down["windowsVirtualKeyCode"]
		}
		p.callPage(t, "Input.dispatchKeyEvent", up, nil)
	}
}

// SetFiles puts the files at paths in the file input selector names,
// as a user picking them would (the input's change event fires).
func (p *Page) SetFiles(t testing.TB, selector string, paths ...string) {
	t.Helper()
	var doc struct{ Root struct{ NodeID int } }
	p.callPage(t, "DOM.getDocument", map[string]any{"depth": 0}, &doc)
	var q struct{ NodeID int }
	p.callPage(t, "DOM.querySelector", map[string]any{"nodeId": doc.Root.NodeID, "selector": selector}, &q)
	if q.NodeID == 0 {
		t.Fatalf("no element %s", selector)
	}
	p.callPage(t, "DOM.setFileInputFiles", map[string]any{"files": paths, "nodeId": q.NodeID}, nil)
}

// AllowDownloads saves the browser's downloads in dir (NewPage refuses
// them).
func (p *Page) AllowDownloads(t testing.TB, dir string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.b.call(ctx, "", "Browser.setDownloadBehavior", map[string]any{"behavior": "allow", "downloadPath": dir}, nil); err != nil {
		t.Fatal(err)
	}
}

// WaitFor evaluates expr until it is true, for up to timeout, and fails
// t with what as the reason otherwise. It returns how long it took.
func (p *Page) WaitFor(t testing.TB, expr string, timeout time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	var lastErr error
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var ok bool
		lastErr = p.eval(ctx, "!!("+expr+")", &ok)
		cancel()
		if lastErr == nil && ok {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s (%v)", what, timeout, lastErr)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// Key modifiers for PressKey (the DevTools protocol's bits).
const (
	ModAlt   = 1
	ModCtrl  = 2
	ModMeta  = 4
	ModShift = 8
)

// PressKey presses and releases a named key ("Tab", "Enter", "Escape")
// with modifiers held.
func (p *Page) PressKey(t testing.TB, key string, modifiers int) {
	t.Helper()
	codes := map[string]int{"Tab": 9, "Enter": 13, "Escape": 27}
	vk, ok := codes[key]
	if !ok {
		t.Fatalf("PressKey: unknown key %q", key)
	}
	for _, typ := range []string{"rawKeyDown", "keyUp"} {
		ev := map[string]any{"type": typ, "key": key, "code": key, "windowsVirtualKeyCode": vk, "modifiers": modifiers}
		if key == "Enter" && typ == "rawKeyDown" {
			ev["type"], ev["text"] = "keyDown", "\r"
		}
		p.callPage(t, "Input.dispatchKeyEvent", ev, nil)
	}
}
