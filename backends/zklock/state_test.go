package zklock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/guard/driver"
)

// TestNoStatePerKey: a key's lock lives in container nodes, which the server
// deletes once they are empty, and its contenders are ephemeral: a key
// locked once and released keeps nothing on the server, only the root
// stays. A server of the test's own runs its container manager every 200 ms
// instead of every minute.
func TestNoStatePerKey(t *testing.T) {
	srv := startServer(t, "-Dznode.container.checkIntervalMs=200")
	l := dial(t, []string{srv.addr})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := testKey(t)
	// Waiting: a JVM just started on a loaded machine may turn the first
	// connection away, which a non-waiting Acquire would report.
	o := driver.AcquireOptions{TTL: testSession, Wait: true}
	take := []func() (driver.Lease, error){
		func() (driver.Lease, error) { return l.Acquire(ctx, k, o) },
		func() (driver.Lease, error) { return l.AcquireRead(ctx, k, o) },
		func() (driver.Lease, error) { return l.AcquireWrite(ctx, k, o) },
		func() (driver.Lease, error) { return l.AcquireSemaphore(ctx, k, 2, o) },
	}
	for i, acquire := range take {
		lease, err := acquire()
		if err != nil {
			t.Fatalf("acquisition %d: %v", i, err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
	for _, parent := range []string{l.lockPath(k), l.semaphorePath(k)} {
		eventually(t, parent+" is deleted by the server", func() bool {
			ok, _, err := l.conn.Exists(parent)
			if err != nil {
				t.Fatal(err)
			}
			return !ok
		})
	}
	if ok, _, err := l.conn.Exists(l.root); err != nil || !ok {
		t.Errorf("root %s: exists %v, %v", l.root, ok, err)
	}
	if _, _, err := l.conn.Children(l.lockPath(k)); !errors.Is(err, zk.ErrNoNode) {
		t.Errorf("children of a reclaimed lock: %v, want ErrNoNode", err)
	}
}
