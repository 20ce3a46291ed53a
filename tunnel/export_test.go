package tunnel

import "time"

// WithLingerWait sets the bound of a tunnel's end (lingerWait) for a test.
func WithLingerWait(d time.Duration) Option { return func(t *Server) { t.lingerWait = d } }

// LingerMaxBytes is lingerMaxBytes, for the tests.
const LingerMaxBytes = lingerMaxBytes
