package mcpserver

import (
	"context"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Approvals: a session created with egressMode "ask" parks a connection
// outside its egress list until someone decides it (issue 42 item 5).

// ListEgressPendingInput is list_egress_pending's arguments.
type ListEgressPendingInput struct {
	Wait    float64 `json:"wait,omitempty" jsonschema:"Seconds to wait for at least one connection to be waiting (default 0: answer at once; at most 45)."`
	Session string  `json:"session,omitempty" jsonschema:"Session id or a name given to create_session. Omit it to use this connection's default session (created on first use, deleted when the MCP client disconnects)."`
}

// ListEgressPendingOutput is list_egress_pending's result.
type ListEgressPendingOutput struct {
	Pending []EgressPending `json:"pending"`
	Session string          `json:"session"`
}

// pendingPoll is how often list_egress_pending looks again while it waits.
const pendingPoll = 250 * time.Millisecond

func (s *Server) listEgressPending(ctx context.Context, _ *mcp.CallToolRequest, in ListEgressPendingInput) (*mcp.CallToolResult, ListEgressPendingOutput, error) {
	var out ListEgressPendingOutput
	id, err := s.sess.resolve(ctx, in.Session)
	if err != nil {
		return nil, out, err
	}
	out.Session = id
	deadline := time.Now().Add(time.Duration(min(max(in.Wait, 0), answerWithin.Seconds()) * float64(time.Second)))
	for {
		ps, err := s.client.EgressPending(ctx, id)
		if err != nil {
			return nil, out, err
		}
		if len(ps) > 0 || !time.Now().Before(deadline) {
			out.Pending = ps
			if out.Pending == nil {
				out.Pending = []EgressPending{}
			}
			return nil, out, nil
		}
		t := time.NewTimer(pendingPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, out, ctx.Err()
		case <-t.C:
		}
	}
}

// DecideEgressInput is decide_egress's arguments.
type DecideEgressInput struct {
	PendingID string `json:"pendingId" jsonschema:"The id of a connection list_egress_pending returned."`
	Decision  string `json:"decision" jsonschema:"allow or deny."`
	Remember  bool   `json:"remember,omitempty" jsonschema:"Keep the decision for the connection's host:port: allow adds it to the session's egress list, deny to its deny list; later connections to it are then decided without asking."`
	Session   string `json:"session,omitempty" jsonschema:"Session id or a name given to create_session. Omit it to use this connection's default session (created on first use, deleted when the MCP client disconnects)."`
}

// DecideEgressOutput is decide_egress's result.
type DecideEgressOutput struct {
	Decided  EgressPending `json:"decided"`
	Decision string        `json:"decision"`
	Remember bool          `json:"remember"`
}

func (s *Server) decideEgress(ctx context.Context, _ *mcp.CallToolRequest, in DecideEgressInput) (*mcp.CallToolResult, DecideEgressOutput, error) {
	var out DecideEgressOutput
	id, err := s.existing(in.Session)
	if err != nil {
		return nil, out, err
	}
	p, err := s.client.DecideEgress(ctx, id, in.PendingID, in.Decision, in.Remember)
	if err != nil {
		return nil, out, err
	}
	return nil, DecideEgressOutput{Decided: *p, Decision: in.Decision, Remember: in.Remember}, nil
}
