package redlock_test

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/redlock"
	"github.com/warden-go/warden/guard"
)

// Five independent masters; the lock needs three of them. The fencing token
// goes with every write to the protected storage, which refuses tokens older
// than the last it accepted.
func Example() {
	var nodes []goredis.UniversalClient
	for _, addr := range []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379", "10.0.0.4:6379", "10.0.0.5:6379"} {
		nodes = append(nodes, goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true}))
	}
	locker, err := redlock.New(nodes, redlock.WithNodeTimeout(50*time.Millisecond))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	lease, err := locker.Acquire(ctx, "reports/daily", guard.AcquireOptions{TTL: 30 * time.Second, Wait: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lease.Release(ctx)
	fmt.Println("writing with fencing token", lease.Token())
}
