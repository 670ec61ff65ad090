package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard"
)

// Fenced writes under a lock: the section writes through Fence with the
// claim of its context (the lock's token on its key), and a holder that
// paused past its lease, writing with its old token after a newer holder
// wrote, is refused. The key carries a hash tag, so that on a Cluster the
// fence and the data keys "{account:42}:..." share its slot.
func ExampleFence() {
	addr := os.Getenv("WARDEN_REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:16379"
	}
	client := goredis.NewClient(&goredis.Options{Addr: addr})
	defer client.Close()
	locker, err := redislock.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	g, err := guard.New(locker, guard.WithPrefix("example:"))
	if err != nil {
		log.Fatal(err)
	}
	f, err := redislock.NewFence(client)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()

	var paused fence.Claim // what a holder that stalled still carries
	write := func(ctx context.Context, l *guard.Lock) error {
		c, _ := fence.FromContext(ctx) // {account:42} at l.Token()
		if paused.Token == 0 {
			paused = c
		}
		_, err := f.IncrBy(ctx, c, "{account:42}:balance", 10)
		return err
	}
	for range 2 {
		if err := g.Do(ctx, "{account:42}", write); err != nil {
			log.Fatal(err)
		}
	}
	// The first holder wakes up and writes with its token.
	_, err = f.IncrBy(ctx, paused, "{account:42}:balance", 10)
	fmt.Println("stale:", errors.Is(err, fence.ErrStaleToken), "lock lost:", errors.Is(err, guard.ErrLockLost))
	// Output: stale: true lock lost: true
}
