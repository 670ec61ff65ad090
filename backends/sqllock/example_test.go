package sqllock_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/glebarez/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard"
)

// A lock on SQLite, with a fenced write. Open the file with WAL and
// a busy timeout so that several processes can share it; on PostgreSQL or
// MySQL, open gorm with their drivers instead and nothing else changes.
func Example() {
	dir, _ := os.MkdirTemp("", "warden-example")
	defer os.RemoveAll(dir)
	dsn := filepath.Join(dir, "app.db") + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)"
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	locker, err := sqllock.New(db)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := locker.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}

	g, err := guard.New(locker, guard.WithTTL(30*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	err = g.Do(ctx, "reports/nightly", func(ctx context.Context, l *guard.Lock) error {
		// The section's writes carry the lock's token, so that a holder
		// that paused past its lease cannot overwrite a newer one's.
		err := db.Transaction(func(tx *gorm.DB) error {
			if err := sqllock.Fence(tx, "reports/nightly", l.Token()); err != nil {
				return err
			}
			// ... the fenced writes go here, on tx ...
			return nil
		})
		// Tokens start from the database's clock, in microseconds.
		fmt.Println("token from the clock:", l.Token() > 1e15, "write:", err)
		// Not reentrant here: a context without this section's lock is
		// another holder.
		_, err = g.TryLock(context.Background(), "reports/nightly")
		fmt.Println("another section:", err)
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// token from the clock: true write: <nil>
	// another section: warden: lock "reports/nightly" not acquired
	// done: <nil>
}
