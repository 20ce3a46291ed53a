package main

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/spf13/cobra"
)

// newSessionPauseCmd and newSessionResumeCmd are `sandgate session pause`
// and `resume`: POST /v1/sessions/{id}/pause and /resume (docs/pause.md).
func newSessionPauseCmd(af *apiFlags) *cobra.Command {
	return sessionPostCmd(af, "pause", "pause a session's processes in place, memory kept (its next use resumes it)")
}

func newSessionResumeCmd(af *apiFlags) *cobra.Command {
	return sessionPostCmd(af, "resume", "resume a paused session")
}

// sessionPostCmd is a session command that POSTs to /v1/sessions/{id}/op
// and prints the session it answers.
func sessionPostCmd(af *apiFlags, op, short string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:               op + " ID|NAME",
		Short:             short,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: completeSessions(af, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := af.client()
			if err != nil {
				return err
			}
			raw, err := c.do(cmd.Context(), http.MethodPost, sessPath(args[0])+"/"+op, nil)
			if err != nil {
				return err
			}
			if asJSON {
				return printRaw(cmd.OutOrStdout(), raw)
			}
			var s session
			if err := json.Unmarshal(raw, &s); err != nil {
				return fmt.Errorf("decode session: %w", err)
			}
			printSession(cmd.OutOrStdout(), &s)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the REST API's JSON answer alone")
	return cmd
}
