package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/warden-go/warden/backends/etcdlock"
	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard"
)

// A fenced transaction: the caller's comparison and writes, applied with the
// fence's check in one etcd Txn; the claim of a holder that lost its lock to
// a newer one is refused and nothing is written.
func ExampleFence() {
	endpoint := os.Getenv("WARDEN_ETCD_ENDPOINTS")
	if endpoint == "" {
		endpoint = "127.0.0.1:12379"
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	locker, err := etcdlock.New(client)
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	g, err := guard.New(locker, guard.WithTTL(10*time.Second), guard.WithPrefix("example:"))
	if err != nil {
		log.Fatal(err)
	}
	f, err := etcdlock.NewFence(client, etcdlock.WithFencePrefix("example/fences/"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()

	var paused fence.Claim
	publish := func(ctx context.Context, l *guard.Lock) error {
		c, _ := fence.FromContext(ctx) // "reports/daily" at l.Token()
		if paused.Token == 0 {
			paused = c
		}
		_, err := f.Txn(ctx, c).
			If(clientv3.Compare(clientv3.Value("example/reports/frozen"), "!=", "yes")).
			Then(clientv3.OpPut("example/reports/daily", "v"+fmt.Sprint(l.Token()))).
			Commit()
		return err
	}
	for range 2 {
		if err := g.Do(ctx, "reports/daily", publish); err != nil {
			log.Fatal(err)
		}
	}
	_, err = f.Txn(ctx, paused).Then(clientv3.OpPut("example/reports/daily", "late")).Commit()
	fmt.Println("stale:", errors.Is(err, fence.ErrStaleToken))
	// Output: stale: true
}
