package backendurl

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/guard/driver/drivertest"
)

// TestOpenEndsWithItsContext: opening a backend whose server accepts
// connections and never answers fails as unavailable once the context ends
// (the CLI's -timeout, a service's start-up bound), not at a bound of the
// client library's, nor never.
func TestOpenEndsWithItsContext(t *testing.T) {
	a, _ := drivertest.Unanswering(t)
	b, _ := drivertest.Unanswering(t)
	c, _ := drivertest.Unanswering(t)
	for _, raw := range []string{
		"postgres://u:p@" + a + "/db?sslmode=disable",
		"mysql://u:p@tcp(" + a + ")/db",
		"redis://" + a + "/0",
		"redlock://" + a + "," + b + "," + c + "/0",
		"etcd://" + a,
		"zk://" + a,
		"consul://" + a,
	} {
		u, err := Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		t.Run(u.Scheme, func(t *testing.T) {
			t.Parallel()
			const bound, grace = time.Second, time.Second
			o := NewOpener()
			defer o.Close()
			ctx, cancel := context.WithTimeout(context.Background(), bound)
			defer cancel()
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				_, err := o.Locker(ctx, u, 10*time.Second)
				done <- err
			}()
			select {
			case err := <-done:
				took := time.Since(start)
				t.Logf("%s: %v after %v", u, err, took.Round(time.Millisecond))
				if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, driver.ErrUnavailable) {
					t.Errorf("%s: %v; want the context's error, or one wrapping ErrUnavailable", u, err)
				}
				if took > bound+grace {
					t.Errorf("%s: Locker returned %v after its %v context began", u, took.Round(time.Millisecond), bound)
				}
			case <-time.After(15 * bound):
				t.Fatalf("%s: Locker still open 15 times its context's bound", u)
			}
		})
	}
}
