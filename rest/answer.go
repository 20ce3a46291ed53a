package rest

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/sandgate/sandgate/dataplane"
)

// answerWriteTimeout bounds each write of an answer to a client: one that
// reads nothing for that long loses it (and the memory it holds is freed).
const answerWriteTimeout = 30 * time.Second

// answerChunk is how much of an answer is written at a time.
const answerChunk = 32 << 10

// writeAnswer writes a command's answer with status: the JSON object v
// (a struct without output fields) with "stdout"/"stdoutBase64" and
// "stderr"/"stderrBase64" added, encoded straight from the outputs' kept
// bytes. The answer is never built in memory: a command's answer costs its
// kept output, not two or three copies of it.
func writeAnswer(w http.ResponseWriter, status int, v any, stdout, stderr dataplane.Output) error {
	rest, err := json.Marshal(v)
	if err != nil || len(rest) < 2 || rest[0] != '{' {
		return fmt.Errorf("encode answer: %v", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	dw := &deadlineWriter{w: w, rc: http.NewResponseController(w)}
	defer dw.done()
	hw := &headerWriter{rw: w, status: status, next: dw}
	bw := bufio.NewWriterSize(hw, answerChunk)
	bw.WriteByte('{')
	writeOutputField(bw, "stdout", stdout)
	bw.WriteByte(',')
	writeOutputField(bw, "stderr", stderr)
	if len(rest) > 2 {
		bw.WriteByte(',')
	}
	bw.Write(rest[1:])
	bw.WriteByte('\n')
	hw.last = true
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write answer: %w", err)
	}
	hw.writeHeader(0)
	return nil
}

// headerWriter writes an answer's status line and headers before its
// first bytes. An answer whose bytes all come in its last write (one that
// fits in answerChunk) gets a Content-Length: it leaves in one write, with
// no chunked encoding, so the client has all of it as soon as it is
// flushed, not only once the handler has returned and the final empty
// chunk follows.
type headerWriter struct {
	rw     http.ResponseWriter
	status int
	next   io.Writer
	last   bool // the next write is the answer's last
	sent   bool
}

func (h *headerWriter) writeHeader(n int) {
	if h.sent {
		return
	}
	h.sent = true
	if h.last {
		h.rw.Header().Set("Content-Length", strconv.Itoa(n))
	}
	h.rw.WriteHeader(h.status)
}

func (h *headerWriter) Write(p []byte) (int, error) {
	h.writeHeader(len(p))
	return h.next.Write(p)
}

// writeOutputField writes "name": text, or "nameBase64": base64.
func writeOutputField(bw *bufio.Writer, name string, o dataplane.Output) {
	if o.IsBase64 {
		bw.WriteString(`"` + name + `Base64":"`)
		enc := base64.NewEncoder(base64.StdEncoding, bw)
		_, _ = enc.Write(o.Bytes())
		_ = enc.Close()
		bw.WriteByte('"')
		return
	}
	bw.WriteString(`"` + name + `":`)
	writeJSONString(bw, o.Bytes())
}

const hexDigits = "0123456789abcdef"

// writeJSONString writes the valid UTF-8 text b as a JSON string, escaped
// as encoding/json escapes it (HTML characters and U+2028/U+2029 too).
func writeJSONString(bw *bufio.Writer, b []byte) {
	bw.WriteByte('"')
	start := 0
	for i := 0; i < len(b); {
		c := b[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			bw.Write(b[start:i])
			switch c {
			case '"', '\\':
				bw.WriteByte('\\')
				bw.WriteByte(c)
			case '\n':
				bw.WriteString(`\n`)
			case '\r':
				bw.WriteString(`\r`)
			case '\t':
				bw.WriteString(`\t`)
			case '\b':
				bw.WriteString(`\b`)
			case '\f':
				bw.WriteString(`\f`)
			default:
				bw.WriteString(`\u00`)
				bw.WriteByte(hexDigits[c>>4])
				bw.WriteByte(hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		if r == '\u2028' || r == '\u2029' || (r == utf8.RuneError && size == 1) {
			bw.Write(b[start:i])
			switch r {
			case '\u2028':
				bw.WriteString(`\u2028`)
			case '\u2029':
				bw.WriteString(`\u2029`)
			default:
				bw.WriteString(`\ufffd`)
			}
			i += size
			start = i
			continue
		}
		i += size
	}
	bw.Write(b[start:])
	bw.WriteByte('"')
}

// deadlineWriter writes to an HTTP answer with a fresh write deadline for
// each write, and flushes it, so that the answer moves as the client reads.
type deadlineWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	_ = d.rc.SetWriteDeadline(time.Now().Add(answerWriteTimeout))
	n, err := d.w.Write(p)
	if err != nil {
		return n, err
	}
	_ = d.rc.Flush()
	return n, nil
}

// done clears the deadline for the connection's next request.
func (d *deadlineWriter) done() { _ = d.rc.SetWriteDeadline(time.Time{}) }
