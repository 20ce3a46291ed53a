package main

import "github.com/spf13/cobra"

// newSessionPauseCmd and newSessionResumeCmd are `sandgate session pause`
// and `resume`: POST /v1/sessions/{id}/pause and /resume (docs/pause.md).
func newSessionPauseCmd(af *apiFlags) *cobra.Command {
	return sessionPostCmd(af, "pause", "pause a session's processes in place, memory kept (its next use resumes it)")
}

func newSessionResumeCmd(af *apiFlags) *cobra.Command {
	return sessionPostCmd(af, "resume", "resume a paused session")
}
