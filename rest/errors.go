// Package rest serves the /v1 REST API: authentication, rate limits,
// session handlers and the JSON error envelope.
package rest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// WriteError writes the JSON error envelope with status and code.
func WriteError(w http.ResponseWriter, status int, code, msg string) {
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sandgate"`)
	}
	noteErrorCode(w, code)
	_ = WriteJSON(w, status, errorBody{Error: errorDetail{Code: code, Message: msg}})
}

// WriteGatewayError maps err (usually a *gateway.Error, or a
// gateway.Sentinel, which errors.As turns into one) to a status code and
// writes the envelope. Internal details never reach the client.
func WriteGatewayError(w http.ResponseWriter, err error) {
	var ge *gateway.Error
	if !errors.As(err, &ge) {
		WriteError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	status, ok := map[gateway.Kind]int{
		gateway.KindInvalid:       http.StatusBadRequest,
		gateway.KindNotFound:      http.StatusNotFound,
		gateway.KindQuota:         http.StatusTooManyRequests,
		gateway.KindUnavailable:   http.StatusServiceUnavailable,
		gateway.KindUnauthorized:  http.StatusUnauthorized,
		gateway.KindConflict:      http.StatusConflict,
		gateway.KindUpstream:      http.StatusBadGateway,
		gateway.KindUnprocessable: http.StatusUnprocessableEntity,
		gateway.KindGone:          http.StatusGone,
		gateway.KindForbidden:     http.StatusForbidden,
		gateway.KindTooLarge:      http.StatusRequestEntityTooLarge,

		gateway.KindInsufficientStorage: http.StatusInsufficientStorage,
		gateway.KindUpstreamTimeout:     http.StatusGatewayTimeout,
	}[ge.Kind]
	if !ok {
		status = http.StatusInternalServerError
	}
	if ge.RetryAfter > 0 {
		secs := (ge.RetryAfter + time.Second - 1) / time.Second
		w.Header().Set("Retry-After", strconv.Itoa(int(secs)))
	}
	WriteError(w, status, ge.Code, ge.Message)
}

// WriteJSON writes v as the JSON answer with status. It returns the error
// of the write, which only tells that the client is gone when the answer
// did not fit net/http's buffer; see FlushJSON.
func WriteJSON(w http.ResponseWriter, status int, v any) error {
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(v); err != nil {
		return fmt.Errorf("encode answer: %w", err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	if _, err := w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("write answer: %w", err)
	}
	return nil
}

// FlushJSON is WriteJSON followed by a flush to the connection, so that a
// client that is gone shows as an error here rather than after the handler.
func FlushJSON(w http.ResponseWriter, status int, v any) error {
	if err := WriteJSON(w, status, v); err != nil {
		return err
	}
	if err := http.NewResponseController(w).Flush(); err != nil {
		return fmt.Errorf("flush answer: %w", err)
	}
	return nil
}
