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

// TestFirstRequestRefused: when a case that holds its first request's
// handler has that request refused before the handler runs (a store
// answering 429s, say), the case fails at once, saying so, instead of
// waiting forever for the handler. Each case runs in a child process,
// since its failure is the point.
func TestFirstRequestRefused(t *testing.T) {
	cases := map[string]struct {
		run  func(*suite, *testing.T)
		want string
	}{
		"LeaseExpiry": {(*suite).testLeaseExpiry, "first request answered 503"},
		"Wait":        {(*suite).testWait, "first request answered 503"},
		"ClientGone":  {(*suite).testClientGone, "first request ended (error <nil>) without running its handler"},
	}
	if name := os.Getenv("HTTPMWTEST_CHILD"); name != "" {
		s := &suite{newStore: func(testing.TB) idempotency.Store { return down{idempotency.NewMemoryStore()} }}
		t.Run(name, func(t *testing.T) { cases[name].run(s, t) })
		return
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), patience/2)
			defer cancel()
			start := time.Now()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestFirstRequestRefused$", "-test.count=1")
			cmd.Env = append(os.Environ(), "HTTPMWTEST_CHILD="+name)
			out, err := cmd.CombinedOutput()
			took := time.Since(start)
			if err == nil {
				t.Fatalf("the case passed with every claim refused:\n%s", out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Fatalf("the case failed after %v without saying %q:\n%s", took, c.want, out)
			}
		})
	}
}
