package backendurl_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/warden-go/warden/backends/backendurl"
	"github.com/warden-go/warden/guard"
)

// A service takes its backend as a URL from a flag or the environment,
// prints it only as String gives it (its secrets masked), and opens the
// Locker and the store it names.
func Example() {
	for _, s := range []string{
		"redis://app:s3cret@10.0.0.7:6379/2",
		"postgres://app@db.internal:5432/orders?password=s3cret&sslmode=require",
		"redis://s3cret@10.0.0.7:6379",
	} {
		u, err := backendurl.Parse(s)
		if err != nil {
			fmt.Println("refused:", err)
			continue
		}
		fmt.Println(u.Scheme, u)
	}

	u, err := backendurl.Parse("memory") // in-process: nothing to reach
	if err != nil {
		log.Fatal(err)
	}
	o := backendurl.NewOpener()
	defer o.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	locker, err := o.Locker(ctx, u, 30*time.Second)
	if err != nil {
		log.Fatal(err) // names the URL, redacted
	}
	g, err := guard.New(locker, guard.WithBackendName(u.Scheme))
	if err != nil {
		log.Fatal(err)
	}
	err = g.Do(ctx, "reports/daily", func(ctx context.Context, l *guard.Lock) error {
		fmt.Println("holding", l.Key())
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// redis redis://xxxxx@10.0.0.7:6379/2
	// postgres postgres://xxxxx@db.internal:5432/orders?password=xxxxx&sslmode=require
	// refused: redis://xxxxx@10.0.0.7:6379: a user info without ':' is a user name with no password, and no credentials are sent (redis-cli reads it as the password): write redis://:PASSWORD@host:port for a password, redis://USER:PASSWORD@host:port for an ACL user
	// holding reports/daily
}
