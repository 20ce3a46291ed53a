package workspace

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Config says where the object store is. Credentials come from the
// usual AWS environment variables (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN), never from flags.
type S3Config struct {
	// URL is s3://bucket/prefix.
	URL string
	// Endpoint is the server's URL (https://s3.amazonaws.com when empty;
	// http://host:port for a local server).
	Endpoint string
	// Region is the bucket's region ("us-east-1" when empty).
	Region string
	// Transport carries the requests (nil: minio-go's default).
	Transport http.RoundTripper
}

// s3Backend keeps objects in a bucket under a prefix, through minio-go.
type s3Backend struct {
	client *minio.Client
	bucket string
	prefix string // "" or ending in "/"
}

// NewS3Backend connects to the object store cfg names. It does not check
// that the store answers: a store that is down is retried by the sync.
func NewS3Backend(cfg S3Config, env func(string) string) (Backend, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return nil, fmt.Errorf("object store %q: want s3://bucket/prefix", cfg.URL)
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		prefix += "/"
	}
	endpoint := cfg.Endpoint
	if endpoint == "" {
		endpoint = env("AWS_ENDPOINT_URL_S3")
	}
	if endpoint == "" {
		endpoint = env("AWS_ENDPOINT_URL")
	}
	if endpoint == "" {
		endpoint = "https://s3.amazonaws.com"
	}
	eu, err := url.Parse(endpoint)
	if err != nil || (eu.Scheme != "http" && eu.Scheme != "https") || eu.Host == "" {
		return nil, fmt.Errorf("object store endpoint %q: want http(s)://host[:port]", endpoint)
	}
	region := cfg.Region
	if region == "" {
		region = env("AWS_REGION")
	}
	if region == "" {
		region = env("AWS_DEFAULT_REGION")
	}
	if region == "" {
		region = "us-east-1"
	}
	creds := credentials.NewStaticV4(env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"), env("AWS_SESSION_TOKEN"))
	client, err := minio.New(eu.Host, &minio.Options{
		Creds: creds, Secure: eu.Scheme == "https", Region: region,
		BucketLookup: minio.BucketLookupPath,
		MaxRetries:   1, // the sync retries with its own backoff
		Transport:    cfg.Transport,
	})
	if err != nil {
		return nil, fmt.Errorf("object store: %w", err)
	}
	return &s3Backend{client: client, bucket: u.Host, prefix: prefix}, nil
}

func (b *s3Backend) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	_, err := b.client.PutObject(ctx, b.bucket, b.prefix+key, r, size, minio.PutObjectOptions{
		ContentType: "application/octet-stream", DisableMultipart: size < 64<<20,
	})
	if err != nil {
		return fmt.Errorf("object store: put %s: %w", key, err)
	}
	return nil
}

func (b *s3Backend) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	o, err := b.client.GetObject(ctx, b.bucket, b.prefix+key, minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("object store: get %s: %w", key, err)
	}
	if _, err := o.Stat(); err != nil {
		o.Close()
		if minio.ToErrorResponse(err).Code == minio.NoSuchKey {
			return nil, fmt.Errorf("object store: %s: %w", key, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("object store: get %s: %w", key, err)
	}
	return notExistReader{o, key}, nil
}

// notExistReader reports an object deleted while it is read as
// fs.ErrNotExist, as Get does one deleted before.
type notExistReader struct {
	*minio.Object
	key string
}

func (r notExistReader) Read(p []byte) (int, error) {
	n, err := r.Object.Read(p)
	if err != nil && minio.ToErrorResponse(err).Code == minio.NoSuchKey {
		return n, fmt.Errorf("object store: %s: %w", r.key, fs.ErrNotExist)
	}
	return n, err
}

func (b *s3Backend) List(ctx context.Context, prefix string) ([]string, error) {
	var keys []string
	for o := range b.client.ListObjects(ctx, b.bucket, minio.ListObjectsOptions{Prefix: b.prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, fmt.Errorf("object store: list %s: %w", prefix, o.Err)
		}
		keys = append(keys, strings.TrimPrefix(o.Key, b.prefix))
	}
	return keys, nil
}

func (b *s3Backend) Delete(ctx context.Context, key string) error {
	err := b.client.RemoveObject(ctx, b.bucket, b.prefix+key, minio.RemoveObjectOptions{})
	if err != nil && minio.ToErrorResponse(err).Code != minio.NoSuchKey {
		return fmt.Errorf("object store: delete %s: %w", key, err)
	}
	return nil
}

// PresignGet is a URL that reads key for ttl without other credentials;
// params are response-* overrides (content type, disposition).
func (b *s3Backend) PresignGet(ctx context.Context, key string, ttl time.Duration, params url.Values) (string, error) {
	u, err := b.client.PresignedGetObject(ctx, b.bucket, b.prefix+key, ttl, params)
	if err != nil {
		return "", err
	}
	return u.String(), nil
}
