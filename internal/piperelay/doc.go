// Package piperelay moves bytes between an OpenSSH client's ProxyCommand
// pipes and a TCP socket. It runs in the client-side proxy process
// (`sandgate proxy`, the copying ProxyCommand), and in the bench's
// `sgbench nc`, which puts the same hop in front of sshd so that the
// bench can show what the hop itself costs.
//
// On Linux, Relay moves both ways on one thread with poll(2), splice(2)
// downstream and one buffer upstream; RelayWebSocket does the same for
// a WebSocket's socket (the proxy's --transport websocket over plain
// http): it reads the gateway's frame headers, splices their payload, and
// writes ssh's bytes up as masked binary messages itself (from then on the
// socket's only reader and writer). Elsewhere both
// report that they did nothing, and the caller copies.
package piperelay
