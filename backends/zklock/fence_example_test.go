package zklock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/warden-go/warden/backends/zklock"
	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard"
)

// A fenced multi: the caller's operations and the fence's check and advance,
// applied together or not at all; a stale claim applies nothing.
func ExampleFence() {
	servers := os.Getenv("WARDEN_ZK_SERVERS")
	if servers == "" {
		servers = "127.0.0.1:12181"
	}
	locker, err := zklock.New(strings.Split(servers, ","), zklock.WithSessionTimeout(4*time.Second), zklock.WithRoot("/warden-example/locks"))
	if err != nil {
		log.Fatal(err)
	}
	defer locker.Close()
	g, err := guard.New(locker, guard.WithTTL(4*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	conn, _, err := zk.Connect(strings.Split(servers, ","), 4*time.Second, zk.WithLogInfo(false))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	f, err := zklock.NewFence(conn, zklock.WithFenceRoot("/warden-example/fences"))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	config := "/warden-example/config"
	if _, err := conn.Create(config, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		log.Fatal(err)
	}

	var paused fence.Claim
	apply := func(ctx context.Context, l *guard.Lock) error {
		c, _ := fence.FromContext(ctx) // "config" at l.Token()
		if paused.Token == 0 {
			paused = c
		}
		_, err := f.Multi(ctx, c, &zk.SetDataRequest{Path: config, Data: []byte(fmt.Sprint(l.Token())), Version: -1})
		return err
	}
	for range 2 {
		if err := g.Do(ctx, "config", apply); err != nil {
			log.Fatal(err)
		}
	}
	_, err = f.Multi(ctx, paused, &zk.SetDataRequest{Path: config, Data: []byte("late"), Version: -1})
	fmt.Println("stale:", errors.Is(err, fence.ErrStaleToken))
	// Output: stale: true
}
