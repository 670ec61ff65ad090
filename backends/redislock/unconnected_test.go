package redislock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestNothingListening: a bounded wait on a client, with go-redis's
// default options, whose address nothing listens on says so. go-redis
// dials on a goroutine of its own and tries again after each refusal (5
// times, 100ms apart), longer than an attempt's bound, so no attempt hears
// the refusal: the error says that no connection is open, and to what.
func TestNothingListening(t *testing.T) {
	addr := drivertest.ClosedAddr(t)
	client := goredis.NewClient(&goredis.Options{Addr: addr})
	defer client.Close()
	g, err := guard.New(newLocker(t, client), guard.WithTTL(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	err = g.Do(context.Background(), "reports/daily", func(context.Context, *guard.Lock) error {
		t.Error("the section ran with nothing listening")
		return nil
	}, guard.WaitAtMost(3*time.Second))
	if !errors.Is(err, guard.ErrUnavailable) || errors.Is(err, guard.ErrNotAcquired) {
		t.Fatalf("Do: %v, want ErrUnavailable", err)
	}
	if want := "with no connection open to " + addr; !strings.Contains(err.Error(), want) {
		t.Errorf("Do: %q does not say %q", err, want)
	}
}

// TestNothingListeningBehindSentinels: a Sentinel-managed client whose
// Sentinels nothing listens on is not said to have no connection to
// go-redis's placeholder address, "FailoverClient".
func TestNothingListeningBehindSentinels(t *testing.T) {
	client := goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{drivertest.ClosedAddr(t)}})
	defer client.Close()
	g, err := guard.New(newLocker(t, client), guard.WithTTL(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, err = g.Lock(context.Background(), "k", guard.WaitAtMost(3*time.Second))
	if !errors.Is(err, guard.ErrUnavailable) || strings.Contains(err.Error(), "FailoverClient") {
		t.Fatalf("Lock: %v, want ErrUnavailable not naming go-redis's placeholder address", err)
	}
}
