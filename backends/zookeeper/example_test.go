package zookeeper_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/warden-go/warden/backends/zookeeper"
	"github.com/warden-go/warden/guard"
)

// A job that must run on one process at a time. The session timeout is the
// lease TTL: if this process dies, the lock is free again within it.
func Example() {
	locker, err := zookeeper.Dial([]string{"127.0.0.1:12181"}, 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()

	ctx := context.Background()
	lease, err := locker.Acquire(ctx, "jobs/nightly-report", guard.AcquireOptions{TTL: 10 * time.Second, Wait: true})
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(ctx)

	// Stop working when the lease is lost: the session may be about to
	// expire, and then another process will be granted the lock.
	work, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lease.Done():
			cancel()
		case <-work.Done():
		}
	}()
	fmt.Println("fencing token", lease.Token())
}
