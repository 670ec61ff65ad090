package zklock_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/backends/zklock"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/idempotency"
)

// A Guard on a ZooKeeper ensemble. The session keeps every lock of the
// Locker alive; a section's context is cancelled before the session could
// have expired on the server.
func Example() {
	servers := os.Getenv("WARDEN_ZK_SERVERS") // "10.0.0.5:2181,10.0.0.6:2181,..."
	if servers == "" {
		servers = "127.0.0.1:12181"
	}
	locker, err := zklock.New(strings.Split(servers, ","), zklock.WithSessionTimeout(10*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	g, err := guard.New(locker, guard.WithTTL(10*time.Second), guard.WithPrefix("example:"))
	if err != nil {
		log.Fatal(err)
	}
	err = g.Do(context.Background(), "jobs/nightly-report", func(ctx context.Context, l *guard.Lock) error {
		// ctx is cancelled, with cause guard.ErrLockLost, if the session
		// is lost. l.Token() is the lock node's czxid: pass it with every
		// write to the protected storage.
		fmt.Println("running", l.Key())
		return nil
	}, guard.WaitAtMost(time.Minute))
	if err != nil {
		fmt.Println("not done:", err)
	}
	// Output: running jobs/nightly-report
}

// An idempotency store on the ensemble: a consumer that may see the same
// message twice, on any instance, credits the account once. The store uses a
// connection of its own (a Locker's session is not shared); leases and
// retention are counted on the servers' clock.
func ExampleNewStore() {
	servers := os.Getenv("WARDEN_ZK_SERVERS")
	if servers == "" {
		servers = "127.0.0.1:12181"
	}
	conn, _, err := zk.Connect(strings.Split(servers, ","), 10*time.Second, zk.WithLogInfo(false))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	store, err := zklock.NewStore(conn, zklock.WithStoreRoot("/warden-example/idem"))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Records of keys never seen again stay until purged: run Purge now and
	// then, here before starting.
	if _, err := store.Purge(ctx); err != nil {
		log.Fatal(err)
	}
	exec, err := idempotency.New(store, idempotency.WithScope("payments-consumer"), idempotency.WithRetention(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	// The message's ID is the key; the broker delivers the message twice.
	messageID := fmt.Sprintf("msg-%d", time.Now().UnixNano())
	for range 2 {
		res, err := exec.Do(ctx, messageID, "credit:acct-1:10EUR", func(ctx context.Context) ([]byte, error) {
			fmt.Println("crediting 10 EUR")
			return []byte("credited 10 EUR"), nil
		})
		fmt.Printf("%s (replayed: %v, err: %v)\n", res.Response, res.Replayed, err)
	}
	// Output:
	// crediting 10 EUR
	// credited 10 EUR (replayed: false, err: <nil>)
	// credited 10 EUR (replayed: true, err: <nil>)
}
