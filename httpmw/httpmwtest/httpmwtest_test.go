package httpmwtest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/warden-go/warden/idempotency"
)

// TestLeaseExpiryFirstRequestFails: when the lease-expiry case's first
// request is refused before its handler runs (a store answering 429s, say),
// the case fails at once, saying so, instead of waiting forever for the
// handler. The case runs in a child process, since its failure is the
// point.
func TestLeaseExpiryFirstRequestFails(t *testing.T) {
	if os.Getenv("HTTPMWTEST_CHILD") == "1" {
		s := &suite{newStore: func(testing.TB) idempotency.Store { return down{idempotency.NewMemoryStore()} }}
		t.Run("ExpiredLeaseLetsRetryRun", s.testLeaseExpiry)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience/2)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestLeaseExpiryFirstRequestFails$", "-test.count=1")
	cmd.Env = append(os.Environ(), "HTTPMWTEST_CHILD=1")
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	if err == nil {
		t.Fatalf("the case passed with every claim refused:\n%s", out)
	}
	if want := "first request answered 503"; !strings.Contains(string(out), want) {
		t.Fatalf("the case failed after %v without saying %q:\n%s", took, want, out)
	}
}
