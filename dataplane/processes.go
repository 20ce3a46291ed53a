package dataplane

// Processes holds every session's background processes. (Placeholder:
// processes.go replaces it.)
type Processes struct{}
