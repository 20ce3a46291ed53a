module github.com/sandgate/sandgate/bench

go 1.26.0

require (
	github.com/pkg/sftp v1.13.12
	go.uber.org/goleak v1.3.0
	golang.org/x/crypto v0.59.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/kr/fs v0.1.0 // indirect
	github.com/sandgate/sandgate v0.0.0
)

replace github.com/sandgate/sandgate => ../
