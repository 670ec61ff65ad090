package etcdlock_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/warden-go/warden/backends/etcdlock"
	"github.com/warden-go/warden/guard"
)

func Example() {
	endpoint := os.Getenv("WARDEN_ETCD_ENDPOINTS")
	if endpoint == "" {
		endpoint = "127.0.0.1:12379"
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	locker, err := etcdlock.New(client, etcdlock.WithRequestTimeout(3*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	// Close revokes the session: every lock still held is released at once.
	defer locker.Close()

	// The TTL is the session's etcd lease: whole seconds, at least
	// etcdlock.MinTTL. One keepalive per TTL/3 keeps every lock of the
	// session alive, however many there are.
	g, err := guard.New(locker, guard.WithTTL(10*time.Second), guard.WithPrefix("example:"))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = g.Do(ctx, "nightly-report", func(ctx context.Context, l *guard.Lock) error {
		// ctx is cancelled if the session is lost. Pass l.Token() along
		// with every write to the protected storage.
		fmt.Println("holding", l.Key())
		return nil
	})
	if err != nil {
		fmt.Println("not done:", err)
	}
	// Output: holding nightly-report
}
