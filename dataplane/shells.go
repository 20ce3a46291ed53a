package dataplane

// Shells holds every session's persistent named shells. (Placeholder:
// commands.go and shells.go replace it.)
type Shells struct{}
