// Package rest serves the /v1 REST API: authentication, rate limits,
// session handlers and the JSON error envelope.
package rest

import (
	"encoding/json"
	"errors"
	"net/http"

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
	writeJSON(w, status, errorBody{Error: errorDetail{Code: code, Message: msg}})
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
		gateway.KindInvalid:      http.StatusBadRequest,
		gateway.KindNotFound:     http.StatusNotFound,
		gateway.KindQuota:        http.StatusTooManyRequests,
		gateway.KindUnavailable:  http.StatusServiceUnavailable,
		gateway.KindUnauthorized: http.StatusUnauthorized,
		gateway.KindConflict:     http.StatusConflict,
	}[ge.Kind]
	if !ok {
		status = http.StatusInternalServerError
	}
	WriteError(w, status, ge.Code, ge.Message)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
