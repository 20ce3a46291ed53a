package workspace

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandgate/sandgate/gateway"
)

// laggingStore is an object store whose listings arrive late: the listing
// is taken, then the answer travels (an S3 LIST is a network call). down
// makes every listing fail.
type laggingStore struct {
	Backend
	lag  time.Duration
	mu   sync.Mutex
	down bool
}

func (b *laggingStore) List(ctx context.Context, prefix string) ([]string, error) {
	b.mu.Lock()
	down := b.down
	b.mu.Unlock()
	if down {
		return nil, errors.New("store unreachable")
	}
	keys, err := b.Backend.List(ctx, prefix)
	time.Sleep(b.lag)
	return keys, err
}

func quotaCode(err error) string {
	var ge *gateway.Error
	if errors.As(err, &ge) {
		return ge.Code
	}
	return ""
}

// TestLimitCountsCreatesFinishedWhileListing: a create that finished
// while another create's listing travelled still counts, and a listing
// that fails refuses the create instead of counting the local store only.
func TestLimitCountsCreatesFinishedWhileListing(t *testing.T) {
	rb, err := newLocalBackend(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	remote := &laggingStore{Backend: rb, lag: 200 * time.Millisecond}
	s, err := New(Config{Dir: t.TempDir(), Remote: remote, MaxWorkspaces: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, name := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// b's listing starts while a's is on its way, and ends after a
			// wrote its doc.
			time.Sleep(time.Duration(i) * 100 * time.Millisecond)
			_, errs[i] = s.CreateWorkspace(ctx, "t1", name)
		}()
	}
	wg.Wait()
	if errs[0] != nil || quotaCode(errs[1]) != "workspace_limit" {
		t.Fatalf("creates: %v, %v; want the first to succeed and the second workspace_limit", errs[0], errs[1])
	}

	// A delete frees the place at once, though the create is recent.
	if err := s.DeleteWorkspace(ctx, "t1", "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateWorkspace(ctx, "t1", "c"); err != nil {
		t.Fatalf("create after the delete: %v", err)
	}

	remote.mu.Lock()
	remote.down = true
	remote.mu.Unlock()
	if err := s.DeleteWorkspace(ctx, "t1", "c"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateWorkspace(ctx, "t1", "d"); quotaCode(err) != "workspace_store_failed" || !strings.Contains(err.Error(), "count") {
		t.Fatalf("create with the store's listing failing = %v, want workspace_store_failed (could not count)", err)
	}
}
