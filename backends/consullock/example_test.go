package consullock_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/warden-go/warden/backends/consullock"
	"github.com/warden-go/warden/guard"
)

// A Guard on a Consul agent. One session renews every lock the Locker
// holds; Consul takes session TTLs of 10 s (MinTTL) or more, and guard
// refuses a shorter one when the Guard is made.
func Example() {
	addr := os.Getenv("WARDEN_CONSUL_ADDR")
	if addr == "" {
		addr = "127.0.0.1:18500"
	}
	client, err := api.NewClient(&api.Config{Address: addr})
	if err != nil {
		log.Fatal(err)
	}
	locker, err := consullock.New(client)
	if err != nil {
		log.Fatal(err)
	}
	// Close destroys the session: every lock still held is deleted at once.
	defer locker.Close()

	if _, err := guard.New(locker, guard.WithTTL(5*time.Second)); err != nil {
		fmt.Println("5 s:", err)
	}
	g, err := guard.New(locker, guard.WithTTL(consullock.MinTTL), guard.WithPrefix("example:"))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = g.Do(ctx, "nightly-report", func(ctx context.Context, l *guard.Lock) error {
		// ctx is cancelled, with cause guard.ErrLockLost, if the session
		// is lost. l.Token() is the lock key's ModifyIndex: pass it with
		// every write to the protected storage.
		fmt.Println("holding", l.Key())
		return nil
	})
	if err != nil {
		fmt.Println("not done:", err)
	}
	// Output:
	// 5 s: warden: guard: invalid option: ttl 5s is below the backend's minimum 10s
	// holding nightly-report
}
