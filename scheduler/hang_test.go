package scheduler_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver/drivertest"
	"github.com/warden-go/warden/scheduler"
)

// Stop holds its bound while the slot store hangs under a client that
// ignores contexts: go-redis with its default options waits out its 5 s
// read timeout, and retries, whatever the context says, so that Stop
// waited 20 s for a slot claim and its give-backs. The runs stop waiting
// for their store calls when Stop comes, and Stop waits for the calls left
// behind only within the Guard's release timeout.
func TestStopIsBoundedWhileTheStoreHangs(t *testing.T) {
	t.Parallel()
	server := drivertest.StartRedis(t)
	c := goredis.NewClient(&goredis.Options{Addr: server.Addr()}) // defaults, as a user writes them
	t.Cleanup(func() { c.Close() })
	l, err := redislock.New(c)
	if err != nil {
		t.Fatal(err)
	}
	store, err := redislock.NewStore(c)
	if err != nil {
		t.Fatal(err)
	}
	const release = time.Second
	g := newGuard(t, l, guard.WithTTL(3*time.Second), guard.WithReleaseTimeout(release))
	var j journal
	s := newScheduler(t, g, scheduler.WithSlotStore(store), scheduler.WithRunObserver(j.observe))
	if err := s.Add("@every 1s", uniqueName("hung"), func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	s.Start()
	j.first(t, scheduler.Ran)
	server.Signal(t, syscall.SIGSTOP)
	// Past the next slot: its claim is on its way to the hung server.
	time.Sleep(1500 * time.Millisecond)
	began := time.Now()
	err = s.Stop(context.Background())
	took := time.Since(began)
	t.Logf("Stop with the store hung: %v, %v", took.Round(time.Millisecond), err)
	if err != nil {
		t.Errorf("Stop: %v", err)
	}
	// The release timeout for the calls left behind, and a second for the
	// runs to see Stop and for a loaded machine.
	if took > release+time.Second {
		t.Errorf("Stop took %v with the store hung, want at most %v", took.Round(time.Millisecond), release+time.Second)
	}
}
