// Package images is sandgate's image store: OCI and Docker images pulled
// from registries or imported from files, kept as unpacked, content-
// addressed layers that the linux sandbox mounts read-only as overlayfs
// lower dirs, shared by every session. It runs in the gateway (sessions
// that start from an image) and in the operator's `sandgate image`
// commands, which may run while the gateway does, on the same data dir.
//
// # API
//
//	Open(dataDir, ...Option) (*Store, error)    open or create <dataDir>/images
//	WithKeychain, WithTransport, WithPlatform,   Options: credentials (default
//	WithLimits, WithStoreLimits,                 authn.DefaultKeychain), HTTP transport,
//	WithPullTimeouts, WithDialer,                platform for indexes, image bounds, the
//	WithMaxUnpacks                               layers unpacked at once, the
//	                                             store's quota and free-space reserve,
//	                                             pull deadline and stall timeout, how the
//	                                             default transport dials (the gateway's
//	                                             egress address rule)
//	HostPlatform() v1.Platform                   linux/GOARCH[/variant], the default platform
//	(*Store).Pull(ctx, ref, PullOptions)         pull from a registry (PullOptions.Insecure,
//	                                             .InsecureRegistries allow plain HTTP)
//	(*Store).Import(ctx, name, path)             OCI layout dir, oci-archive, docker save tar
//	(*Store).Get(name) (Image, error)            a stored image by (normalised) name; ErrNotFound
//	(*Store).List() ([]Image, error)             every stored image, by name
//	(*Store).Remove(name, force) (Image, error)  drop from the index; ErrInUse while a session
//	                                             holds it, unless force
//	(*Store).Prune() (PruneResult, error)        delete layers no image and no session uses
//	(*Store).Acquire(sessionID, name)            a session starts using an image: returns it
//	(*Store).Release(sessionID)                  the session ended
//	(*Store).Refs() ([]Ref, error)               every session reference (for a restart)
//	(*Store).Dir() string                        <dataDir>/images
//	(*Store).Usage() (int64, error)              allocated bytes of the stored layers
//	(*Store).StoreLimits() StoreLimits           the quota and reserve, defaults resolved
//	Normalize(ref) (string, error)               python:3 -> docker.io/library/python:3
//	Allowed(name, patterns) bool                 allow-list match (see Allowed for patterns)
//	CheckPattern(p) error                        validate an allow-list pattern
//	PatternRegistry(p) string                    the one registry a pattern names, if any
//	Image, Ref, PruneResult, PullOptions,        the values above
//	Limits, StoreLimits
//	Error, ErrNotFound, ErrInUse, ErrTooLarge,   constant sentinel errors (errors.Is)
//	ErrStoreFull, ErrPullTimeout
//	RegistryError                                a registry's refusal: StatusCode and its reason
//
// # Using it from the gateway
//
// At session creation: check the requested image with Allowed against the
// configured patterns; Acquire(sessionID, name) (Get, then Pull if it is
// ErrNotFound and pulling on demand is wanted, then Acquire); start the
// sandbox from the returned Image. Env and WorkingDir are the image's;
// Entrypoint, Cmd and User are kept but sandgate runs its own init.
// LayerDirs lists the lower dirs bottom first, so overlayfs's
// "lowerdir=" option, which lists the top layer first, takes them in
// reverse. The dirs are read-only by contract: never write to them, mount
// them (or an idmapped mount of them) with an upper dir of the session's
// own. On session end (delete, expiry, teardown): Release(sessionID).
// After a restart, Release the Refs whose sessions the gateway no longer
// has; a reference outlives the process on purpose, so that a prune run
// while the gateway is down never removes a kept sandbox's layers.
//
// Owners on disk are the image's own ids (0..65535; others become 65534),
// meant for an idmapped mount into the sandbox's user namespace. Because
// they are real ids on the host, <dataDir>/images is mode 0700: no host
// user reaches the layers. Whiteouts are in overlayfs form (a 0:0
// character device; the trusted.overlay.opaque xattr), which only root in
// the initial user namespace can create: pulls and imports need root on
// Linux.
//
// # On disk
//
//	<dataDir>/images/                   0700
//	  index.json                        the images: name, manifest digest, config (env,
//	                                    workingDir, user, entrypoint, cmd), layers (diffID,
//	                                    blob digest, size) bottom first, sizeBytes, pulledAt,
//	                                    source; replaced whole by rename
//	  index.lock                        flock, held for each read-modify-write of the index
//	  gc.lock                           flock: pulls and imports hold it shared, Prune
//	                                    exclusive while it moves layers out
//	  layers/sha256/<diffID hex>/
//	    layer.json                      diffID, blob digest, tar size, unpacked size, allocated
//	                                    bytes (blocks, what the quota counts), entries
//	    root/                           the unpacked layer: an overlayfs lower dir
//	  refs/<sessionID>                  a session's reference: JSON {name, digest, diffIDs}
//	  tmp/                              layers being unpacked, oci-archives being read,
//	                                    layers being deleted
//
// # Concurrency and failure
//
// Readers (Get, List) read index.json without a lock. Writers take
// index.lock only to rewrite it. A layer is unpacked into its own dir in
// tmp/ and renamed into layers/; when two processes unpack one layer, the
// second rename fails and its copy is discarded. In one process,
// concurrent pulls of one reference share one pull, and concurrent unpacks
// of one layer share one unpack; a caller that gives up (its context ends)
// does not cancel the work for the others. A pull or import that fails
// leaves the index as it was and removes its temporary dirs; the layers it
// finished are removed at once when no other pull runs, else by Prune.
// Open, when no pull runs, and Prune clear what a crashed process left in
// tmp/.
//
// # Verification and unpacking
//
// Every layer blob is checked against the manifest's digest (and size) and
// its uncompressed tar against the config's diffID, as it streams through
// decompression (gzip, zstd or none, by magic bytes) into the unpacker. A
// layer already stored (same diffID) is not fetched again. The digest of
// a pulled or layout image is its manifest's. A docker save archive has no
// manifest: its digest is that of the OCI manifest describing its config
// and its uncompressed layers (digest = diffID), which is stable across
// re-imports.
//
// Unpacking assumes hostile input. Every file operation goes through an
// os.Root at the layer's temporary dir, so the kernel refuses any path
// that leaves it, including through symlinks the layer made. An entry
// whose path climbs out with ".." refuses the layer; an absolute path is
// read relative to the layer root; a write, hard link, whiteout or opaque
// marker through a symlink that leaves the layer refuses the layer; a hard
// link must name a file of the same layer. Symlinks themselves are kept as
// written (they resolve inside the sandbox). Device nodes and FIFOs are
// skipped; setuid and setgid are stripped from files (setgid on
// directories is kept: it only sets the group of new files); only user.*
// xattrs are kept (no security.capability, no trusted.overlay.* or
// user.overlay.* from the image, no ACLs). File data is written sparsely:
// an aligned 4 KiB block of zeros, a hole of a sparse entry (GNU or PAX)
// or zeros in a regular file, is skipped and the file truncated to its
// size, so holes take no disk.
//
// # Bounds
//
// Limits bound one image (ErrTooLarge): uncompressed bytes of a layer and
// of the image (both the tar streams and the files' lengths, holes
// included), a layer's tar against its compressed blob (MaxRatio times
// it, or RatioFloor if more: a decompression bomb stops there), entries,
// layers; manifests, indexes and configs are read whole only up to 4 MiB
// (a larger one is refused at its Content-Length, or as soon as it passes
// the bound). StoreLimits bound the store (ErrStoreFull): its quota counts
// the blocks its layers take (layer.json's allocBytes), checked before an
// unpack and as it writes; the free-space reserve is checked before and
// every 32 MiB written. At most WithMaxUnpacks layers (default 4) are
// fetched and unpacked at once, all pulls together, which bounds the
// memory of decompressors. A pull has a deadline and a stall timeout
// (ErrPullTimeout), which a RoundTripper around the store's transport
// applies to every request, redirects and token requests included. An
// error answer from another host than the registry keeps its status but
// loses its body (RegistryError). Whatever fails, nothing of the layer
// stays: its temporary dir is removed.
package images
