package redislock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/redislock"
	"github.com/warden-go/warden/guard"
)

// A Guard on one Redis deployment: the lease keeper renews every held lock
// in one pipeline per renewal period, and cancels the section's context
// before a lease it could not renew expires.
func Example() {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	locker, err := redislock.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	g, err := guard.New(locker, guard.WithTTL(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = g.Do(context.Background(), "invoices/42", func(ctx context.Context, l *guard.Lock) error {
		fmt.Println("fencing token", l.Token())
		return nil
	}, guard.WaitAtMost(5*time.Second), guard.Fair())
	if err != nil {
		log.Print(err)
	}
}

// Many readers or one writer; a waiting writer keeps new readers out.
func Example_readWrite() {
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	locker, err := redislock.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	g, err := guard.New(locker)
	if err != nil {
		log.Fatal(err)
	}
	err = g.Do(context.Background(), "catalog", func(ctx context.Context, l *guard.Lock) error {
		// rebuild the catalog: no reader sees it half done
		return nil
	}, guard.Write(), guard.WaitAtMost(5*time.Second))
	if err != nil {
		log.Print(err)
	}
}
