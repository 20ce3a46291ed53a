module github.com/sandgate/sandgate/bench

go 1.26.0

require (
	github.com/google/go-containerregistry v0.22.1
	github.com/pkg/sftp v1.13.12
	go.uber.org/goleak v1.3.0
	golang.org/x/crypto v0.59.0
	golang.org/x/sys v0.50.0
)

require (
	github.com/coder/websocket v1.8.15 // indirect
	github.com/docker/cli v29.7.2+incompatible // indirect
	github.com/docker/docker-credential-helpers v0.9.3 // indirect
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	github.com/sirupsen/logrus v1.10.2 // indirect
	golang.org/x/sync v0.25.0 // indirect
)

require (
	github.com/kr/fs v0.1.0 // indirect
	github.com/sandgate/sandgate v0.0.0
)

replace github.com/sandgate/sandgate => ../
