package redlock_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/redlock"
	"github.com/warden-go/warden/guard"
)

// Five independent masters; the lock needs three of them. The fencing token
// goes with every write to the protected storage, which refuses tokens older
// than the last it accepted.
func Example() {
	addrs := os.Getenv("WARDEN_REDLOCK_ADDRS") // "10.0.0.1:6379,10.0.0.2:6379,..."
	if addrs == "" {
		addrs = "127.0.0.1:16380,127.0.0.1:16381,127.0.0.1:16382,127.0.0.1:16383,127.0.0.1:16384"
	}
	var nodes []goredis.UniversalClient
	for _, addr := range strings.Split(addrs, ",") {
		node := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
		defer node.Close()
		nodes = append(nodes, node)
	}
	locker, err := redlock.New(nodes)
	if err != nil {
		log.Fatal(err)
	}
	g, err := guard.New(locker, guard.WithTTL(30*time.Second), guard.WithPrefix("example:"))
	if err != nil {
		log.Fatal(err)
	}
	err = g.Do(context.Background(), "reports/daily", func(ctx context.Context, l *guard.Lock) error {
		// ctx is cancelled, with cause guard.ErrLockLost, if no majority
		// renews the lock in time.
		fmt.Println("holding", l.Key(), "on a majority of", len(nodes), "masters")
		return nil
	}, guard.WaitAtMost(time.Minute))
	if err != nil {
		fmt.Println("not done:", err)
	}
	// Output: holding reports/daily on a majority of 5 masters
}
