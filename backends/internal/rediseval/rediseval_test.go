package rediseval_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/warden-go/warden/backends/internal/rediseval"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestEvalOnce: a script whose answer is lost with its connection, on a
// client with go-redis's default retries, runs once under EvalOnce, which
// fails, and twice under Eval, which go-redis sends again on a new
// connection.
func TestEvalOnce(t *testing.T) {
	s := drivertest.StartRedis(t)
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	defer admin.Close()
	const incr = "return redis.call('INCR', KEYS[1])"
	for _, c := range []struct {
		name string
		eval func(context.Context, rediseval.Client, ...any) *goredis.Cmd
		runs int
	}{
		{"EvalOnce", rediseval.EvalOnce, 1},
		{"Eval", rediseval.Eval, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := t.Context()
			p := drivertest.StartProxy(t, s.Addr())
			client := goredis.NewClient(&goredis.Options{Addr: p.Addr()})
			defer client.Close()
			// A first run, so that a connection is idle and the second
			// goes out at once.
			if err := c.eval(ctx, client, "eval", incr, 1, c.name+"-warm").Err(); err != nil {
				t.Fatal(err)
			}
			key := c.name + "-runs"
			p.LoseReplies()
			defer p.Reset()
			done := make(chan error, 1)
			go func() { done <- c.eval(ctx, client, "eval", incr, 1, key).Err() }()
			deadline := time.Now().Add(20 * time.Second)
			for admin.Get(ctx, key).Val() != "1" {
				if time.Now().After(deadline) {
					t.Fatal("timed out waiting until the server ran the script")
				}
				time.Sleep(5 * time.Millisecond)
			}
			p.Reset()
			err := <-done
			if c.runs == 1 && err == nil {
				t.Error("answer lost: no error")
			}
			if got := admin.Get(ctx, key).Val(); got != strconv.Itoa(c.runs) {
				t.Errorf("answer lost: the script ran %s times, want %d", got, c.runs)
			}
		})
	}
}
