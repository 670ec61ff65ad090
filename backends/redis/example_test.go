package redis_test

import (
	"context"
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/redis"
	"github.com/warden-go/warden/guard"
)

// A Locker on one Redis deployment. guard.Guard normally drives it (watchdog,
// reentrancy, tracing); here it is used directly.
func Example() {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	locker := redis.New(client, redis.WithPrefix("myapp:"))

	ctx := context.Background()
	lease, err := locker.Acquire(ctx, "invoices/42", guard.AcquireOptions{TTL: 10 * time.Second, Wait: true, Fair: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer lease.Release(ctx)
	fmt.Println("fencing token", lease.Token())
}

// Many readers or one writer; a waiting writer keeps new readers out.
func ExampleLocker_AcquireWrite() {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	locker := redis.New(client)

	ctx := context.Background()
	w, err := locker.AcquireWrite(ctx, "catalog", guard.AcquireOptions{TTL: 5 * time.Second, Wait: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer w.Release(ctx)
}
