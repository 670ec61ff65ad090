package sqllock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/guard/driver"
	"github.com/warden-go/warden/idempotency"
)

// TestReadsRefusedByAPlugin: when another plugin's row callback fails a
// read, the Store's and the Locker's calls that read a row return its
// error. They panicked scanning the nil *sql.Row gorm's Row returns then.
func TestReadsRefusedByAPlugin(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			g := migrated(t, db, db.dsn(t))
			st, err := sqllock.NewStore(g)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := st.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			l := newLocker(t, g)
			key := uniqueKey(t)
			held, err := l.Acquire(ctx, key, driver.AcquireOptions{TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer held.Release(ctx)
			claim := idempotency.Claim{Key: key, Owner: "a", Lease: time.Minute}
			if _, err := st.Claim(ctx, claim); err != nil {
				t.Fatal(err)
			}
			refused := errors.New("refused by a plugin")
			if err := g.Callback().Row().Before("gorm:row").Register("test:refuse", func(tx *gorm.DB) { tx.AddError(refused) }); err != nil {
				t.Fatal(err)
			}
			calls := map[string]func() error{
				"Store.Claim": func() error {
					_, err := st.Claim(ctx, idempotency.Claim{Key: key, Owner: "b", Lease: time.Minute})
					return err
				},
				"Store.Get":                        func() error { _, err := st.Get(ctx, "", key); return err },
				"Store.Delete of another's record": func() error { return st.Delete(ctx, "", key, "b") },
				"Locker.Inspect":                   func() error { _, err := l.Inspect(ctx, key); return err },
				"Locker.ForceRelease": func() error {
					_, err := l.ForceRelease(ctx, key, driver.ReleaseTarget{AnyHolder: true})
					return err
				},
				"Locker.List": func() error { _, err := l.List(ctx, key, "", 10); return err },
			}
			if db.name == "mariadb" {
				// Only on MySQL does an Extend that matched no row read
				// whether the claim is there: it counts changed rows.
				calls["Store.Extend of another's record"] = func() error { return st.Extend(ctx, "", key, "b", time.Minute) }
			}
			for name, call := range calls {
				func() {
					defer func() {
						if p := recover(); p != nil {
							t.Errorf("%s panicked: %v", name, p)
						}
					}()
					if err := call(); !errors.Is(err, refused) {
						t.Errorf("%s with its read refused: %v, want the plugin's error", name, err)
					}
				}()
			}
		})
	}
}
