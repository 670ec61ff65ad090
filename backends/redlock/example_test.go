package redlock_test

import (
	"context"
	"fmt"
	"log"
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
	locker, err := redlock.New(nodes)
	if err != nil {
		log.Fatal(err)
	}
	g, err := guard.New(locker, guard.WithTTL(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	err = g.Do(context.Background(), "reports/daily", func(ctx context.Context, l *guard.Lock) error {
		fmt.Println("writing with fencing token", l.Token())
		return nil
	}, guard.WaitAtMost(time.Minute))
	if err != nil {
		log.Print(err)
	}
}
