package zklock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/warden-go/warden/backends/zklock"
	"github.com/warden-go/warden/guard"
)

// A Guard on a ZooKeeper ensemble. The session keeps every lock of the
// Locker alive; a section's context is cancelled before the session could
// have expired on the server.
func Example() {
	locker, err := zklock.New([]string{"127.0.0.1:2181"}, zklock.WithSessionTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	g, err := guard.New(locker, guard.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = g.Do(context.Background(), "jobs/nightly-report", func(ctx context.Context, l *guard.Lock) error {
		fmt.Println("running with fencing token", l.Token())
		return nil
	}, guard.WaitAtMost(time.Minute))
	if err != nil {
		log.Print(err)
	}
}
