package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/guard"
)

// A Guard on one Redis deployment: the lease keeper renews every held lock
// in one pipeline per renewal period, and cancels the section's context
// before a lease it could not renew expires.
func Example() {
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr()})
	defer client.Close()
	locker, err := redislock.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	g, err := guard.New(locker, guard.WithTTL(10*time.Second), guard.WithPrefix("example:"))
	if err != nil {
		log.Fatal(err)
	}
	err = g.Do(context.Background(), "invoices/42", func(ctx context.Context, l *guard.Lock) error {
		// ctx is cancelled, with cause guard.ErrLockLost, if the lock is
		// lost. Tokens start from the server's clock in microseconds: pass
		// l.Token() with every write to the protected storage.
		fmt.Println("holding", l.Key(), "token from the clock:", l.Token() > 1e15)
		return nil
	}, guard.WaitAtMost(5*time.Second), guard.Fair())
	if err != nil {
		fmt.Println("not done:", err)
	}
	// Output: holding invoices/42 token from the clock: true
}

// Many readers or one writer; a waiting writer keeps new readers out.
func Example_readWrite() {
	client := goredis.NewClient(&goredis.Options{Addr: redisAddr()})
	defer client.Close()
	locker, err := redislock.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	// A prefix of its own keeps this process's keys apart from any other
	// program's on the server.
	g, err := guard.New(locker, guard.WithPrefix(fmt.Sprintf("example-%d:", os.Getpid())))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	// Two readers at once; each context without a lock is another holder.
	r1, err := g.TryLock(ctx, "catalog", guard.Read())
	if err != nil {
		log.Fatal(err)
	}
	r2, err := g.TryLock(ctx, "catalog", guard.Read())
	if err != nil {
		log.Fatal(err)
	}
	_, err = g.TryLock(ctx, "catalog", guard.Write())
	fmt.Println("writer while two read:", errors.Is(err, guard.ErrNotAcquired))
	r1.Unlock(ctx)
	r2.Unlock(ctx)
	err = g.Do(ctx, "catalog", func(ctx context.Context, l *guard.Lock) error {
		fmt.Println("rebuilding the catalog: no reader sees it half done")
		return nil
	}, guard.Write(), guard.WaitAtMost(5*time.Second))
	if err != nil {
		fmt.Println("not done:", err)
	}
	// Output:
	// writer while two read: true
	// rebuilding the catalog: no reader sees it half done
}

// redisAddr is the server the examples talk to: $WARDEN_REDIS_ADDR, as the
// tests' servers set it, or Redis's default port.
func redisAddr() string {
	if addr := os.Getenv("WARDEN_REDIS_ADDR"); addr != "" {
		return addr
	}
	return "127.0.0.1:16379"
}
