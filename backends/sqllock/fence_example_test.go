package sqllock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/glebarez/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard"
)

type exampleAccount struct {
	ID      int64
	Balance int64
}

// An update through gorm, fenced by the lock of its context: register
// FencePlugin once, and mark the statement with FencedByContext (or Fenced
// with a claim). A holder that lost its lock to a newer one is refused, and
// its transaction rolled back.
func ExampleFencedByContext() {
	dir, _ := os.MkdirTemp("", "warden-example")
	defer os.RemoveAll(dir)
	db, err := gorm.Open(sqlite.Open(filepath.Join(dir, "app.db")+"?_pragma=busy_timeout(5000)"), &gorm.Config{Logger: logger.Discard})
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
	if err := locker.Migrate(ctx); err != nil { // the fence table too
		fmt.Println(err)
		return
	}
	if err := db.Use(sqllock.FencePlugin{}); err != nil {
		fmt.Println(err)
		return
	}
	db.AutoMigrate(&exampleAccount{})
	db.Create(&exampleAccount{ID: 42})
	g, err := guard.New(locker)
	if err != nil {
		fmt.Println(err)
		return
	}

	var paused fence.Claim
	credit := func(ctx context.Context, l *guard.Lock) error {
		if paused.Token == 0 {
			paused = fence.Of(l)
		}
		return db.WithContext(ctx).Scopes(sqllock.FencedByContext).
			Model(&exampleAccount{ID: 42}).Update("balance", gorm.Expr("balance + 10")).Error
	}
	for range 2 {
		if err := g.Do(ctx, "account/42", credit); err != nil {
			fmt.Println(err)
			return
		}
	}
	err = db.Scopes(sqllock.Fenced(paused)).Model(&exampleAccount{ID: 42}).Update("balance", gorm.Expr("balance + 10")).Error
	var a exampleAccount
	db.First(&a, 42)
	fmt.Println("stale:", errors.Is(err, sqllock.ErrStaleToken), "balance:", a.Balance)
	// Output: stale: true balance: 20
}
