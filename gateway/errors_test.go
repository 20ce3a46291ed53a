package gateway_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/sandgate/sandgate/gateway"
)

func TestSentinelErrors(t *testing.T) {
	cases := []struct {
		err  gateway.Sentinel
		kind gateway.Kind
		code string
		msg  string
	}{
		{gateway.ErrNotFound, gateway.KindNotFound, "not_found", "session not found"},
		{gateway.ErrUnauthorized, gateway.KindUnauthorized, "unauthorized", "missing or invalid bearer token"},
	}
	for _, c := range cases {
		t.Run(c.code, func(t *testing.T) {
			if c.err.Error() != c.msg {
				t.Errorf("Error() = %q, want %q", c.err.Error(), c.msg)
			}
			wrapped := fmt.Errorf("lookup: %w", c.err)
			if !errors.Is(wrapped, c.err) {
				t.Error("errors.Is does not find the wrapped sentinel")
			}
			for _, other := range cases {
				if other.err != c.err && errors.Is(wrapped, other.err) {
					t.Errorf("errors.Is matches %q too", other.code)
				}
			}
			ge, ok := gateway.AsError(wrapped)
			if !ok || ge.Kind != c.kind || ge.Code != c.code || ge.Message != c.msg {
				t.Fatalf("AsError = %+v, %v; want kind %d code %q message %q", ge, ok, c.kind, c.code, c.msg)
			}
			// What errors.As hands out is a copy: changing it changes
			// nothing for the next caller.
			ge.Code, ge.Message = "changed", "changed"
			if again, _ := gateway.AsError(c.err); again.Code != c.code || again.Message != c.msg {
				t.Errorf("after a change to one copy, AsError = %+v", again)
			}
		})
	}
}
