package mcpserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
)

// sessions tracks the sandbox sessions of one MCP connection: the default
// one (attached, or created on first need), the names given at
// create_session, and which sessions end with the connection.
type sessions struct {
	client *Client
	log    *slog.Logger

	// create serialises the lazy creation of the default session.
	create sync.Mutex

	mu        sync.Mutex
	defaultID string            // "" until attached or created
	names     map[string]string // name given at create_session -> session id
	owned     []string          // deleted by closeAll (unnamed sessions made here)
	closed    bool
}

func newSessions(c *Client, log *slog.Logger, attach string) *sessions {
	return &sessions{client: c, log: log, defaultID: attach, names: map[string]string{}}
}

// resolve turns a tool's session argument into a session id: "" is the
// default session (created now if there is none), a name given at
// create_session is its session, anything else is taken as an id.
func (s *sessions) resolve(ctx context.Context, arg string) (string, error) {
	if arg != "" {
		s.mu.Lock()
		id, ok := s.names[arg]
		s.mu.Unlock()
		if ok || strings.HasPrefix(arg, "sbx-") {
			return cmp.Or(id, arg), nil
		}
		// A name given at create_session through another connection (or
		// before a restart): the gateway keeps session names.
		if id, err := s.client.SessionNamed(ctx, arg); err == nil && id != "" {
			return id, nil
		}
		return arg, nil
	}
	s.create.Lock()
	defer s.create.Unlock()
	s.mu.Lock()
	id, closed := s.defaultID, s.closed
	s.mu.Unlock()
	if id != "" {
		return id, nil
	}
	if closed {
		return "", errors.New("the MCP server is shutting down")
	}
	sess, err := s.client.CreateSession(ctx, CreateSessionRequest{Metadata: map[string]any{"createdBy": "sandgate mcp", "role": "default"}})
	if err != nil {
		return "", fmt.Errorf("create the default session: %w", err)
	}
	s.log.Info("mcp_default_session_created", "session", sess.SessionID)
	s.mu.Lock()
	s.defaultID = sess.SessionID
	s.owned = append(s.owned, sess.SessionID)
	s.mu.Unlock()
	return sess.SessionID, nil
}

// created records a session made by create_session: named ones are kept
// after the connection ends, unnamed ones are not.
func (s *sessions) created(id, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name != "" {
		s.names[name] = id
		return
	}
	s.owned = append(s.owned, id)
}

// nameTaken reports whether name already names a session here.
func (s *sessions) nameTaken(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.names[name]
	return ok
}

// deleted forgets a session deleted by delete_session.
func (s *sessions) deleted(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.defaultID == id {
		s.defaultID = ""
	}
	for n, v := range s.names {
		if v == id {
			delete(s.names, n)
		}
	}
	for i, v := range s.owned {
		if v == id {
			s.owned = append(s.owned[:i], s.owned[i+1:]...)
			break
		}
	}
}

// isDefault reports whether id is the current default session.
func (s *sessions) isDefault(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return id != "" && s.defaultID == id
}

// kept reports whether id outlives the connection.
func (s *sessions) kept(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range s.owned {
		if v == id {
			return false
		}
	}
	return true
}

// closeAll deletes the sessions this connection owns. Later tool calls
// that need a new default session fail.
func (s *sessions) closeAll(ctx context.Context) error {
	s.create.Lock() // wait for a default session being created
	defer s.create.Unlock()
	s.mu.Lock()
	s.closed = true
	owned := s.owned
	s.owned = nil
	s.mu.Unlock()
	var errs []error
	for _, id := range owned {
		err := s.client.DeleteSession(ctx, id)
		if err != nil && !IsStatus(err, http.StatusNotFound) && !IsStatus(err, http.StatusGone) {
			errs = append(errs, fmt.Errorf("delete session %s: %w", id, err))
			continue
		}
		s.log.Info("mcp_session_deleted", "session", id)
	}
	return errors.Join(errs...)
}
