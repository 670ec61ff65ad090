package etcd_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/warden-go/warden/backends/etcd"
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
	locker, err := etcd.New(client, etcd.WithKeyPrefix("example/locks"))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The TTL is the session's etcd lease: whole seconds, at least etcd.MinTTL.
	lease, err := locker.Acquire(ctx, "nightly-report", guard.AcquireOptions{TTL: 10 * time.Second, Wait: true})
	if err != nil {
		fmt.Println("not acquired:", err)
		return
	}
	defer lease.Release(context.Background())

	select {
	case <-lease.Done():
		fmt.Println("lock lost before the work started")
	default:
		// Pass lease.Token() along with every write to the protected storage.
		fmt.Println("holding", lease.Key())
	}
}
