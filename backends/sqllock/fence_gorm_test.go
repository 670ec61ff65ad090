package sqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/warden-go/warden/backends/memory"
	"github.com/warden-go/warden/backends/sqllock"
	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/fence/fencetest"
	"github.com/warden-go/warden/guard"
	"github.com/warden-go/warden/guard/driver"
)

// fenceRow is the suite's register: one row per resource.
type fenceRow struct {
	Resource string `gorm:"primaryKey;type:varchar(255)"`
	Value    string `gorm:"type:varchar(255)"`
	N        int64
}

func (fenceRow) TableName() string { return "warden_test_fence_data" }

// fenceStore writes Set through the Fenced scope and Incr through Fence in
// the caller's transaction.
type fenceStore struct{ db *gorm.DB }

func (s fenceStore) Set(ctx context.Context, c fence.Claim, value string) error {
	return s.db.WithContext(ctx).Scopes(sqllock.Fenced(c)).
		Clauses(clause.OnConflict{Columns: []clause.Column{{Name: "resource"}}, DoUpdates: clause.AssignmentColumns([]string{"value"})}).
		Create(&fenceRow{Resource: c.Resource, Value: value}).Error
}

func (s fenceStore) Incr(ctx context.Context, c fence.Claim) error {
	return s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := sqllock.Fence(tx, c.Resource, c.Token); err != nil {
			return err
		}
		// The fence row stays locked until the end: no other writer of the
		// resource runs between the update and the insert.
		res := tx.Model(&fenceRow{}).Where("resource = ?", c.Resource).Update("n", gorm.Expr("n + 1"))
		if res.Error != nil || res.RowsAffected > 0 {
			return res.Error
		}
		return tx.Create(&fenceRow{Resource: c.Resource, N: 1}).Error
	})
}

// Get reads the row and the fence in one statement, hence one snapshot.
func (s fenceStore) Get(ctx context.Context, r string) (fencetest.State, error) {
	var v sql.NullString
	var n, high sql.NullInt64
	err := s.db.WithContext(ctx).Raw("SELECT (SELECT value FROM warden_test_fence_data WHERE resource = ?),"+
		" (SELECT n FROM warden_test_fence_data WHERE resource = ?), (SELECT token FROM "+sqllock.DefaultFenceTable+" WHERE resource = ?)",
		r, r, r).Row().Scan(&v, &n, &high)
	return fencetest.State{Value: v.String, Count: n.Int64, Highest: uint64(high.Int64)}, err
}

// fenceDB returns a migrated database with the suite's data table, and its
// DSN.
func fenceDB(t testing.TB, db database) (*gorm.DB, string) {
	t.Helper()
	dsn := db.dsn(t)
	g := migrated(t, db, dsn)
	if err := g.AutoMigrate(&fenceRow{}); err != nil {
		t.Fatal(err)
	}
	return g, dsn
}

func newFenceStore(t testing.TB, g *gorm.DB) fencetest.Store {
	if err := g.Use(sqllock.FencePlugin{}); err != nil {
		t.Fatal(err)
	}
	return fenceStore{db: g}
}

func TestFenceConformance(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			_, dsn := fenceDB(t, db)
			b := fencetest.Backend{New: func(t testing.TB) fencetest.Store { return newFenceStore(t, openDB(t, db, dsn)) }}
			if db.name == "sqlite" {
				b.NoCut = "SQLite runs in the test's process: no connection to cut"
			}
			if b.NoCut == "" {
				host := hostOf(dsn)
				b.Upstream = host
				b.Through = func(t testing.TB, relay string) fencetest.Store {
					return newFenceStore(t, openDB(t, db, strings.Replace(dsn, host, relay, 1)))
				}
			}
			fencetest.Run(t, b)
		})
	}
}

// hostOf is the host:port of a PostgreSQL URL or a MySQL tcp(...) DSN.
func hostOf(dsn string) string {
	if i := strings.Index(dsn, "tcp("); i >= 0 {
		rest := dsn[i+4:]
		return rest[:strings.IndexByte(rest, ')')]
	}
	rest := dsn[strings.Index(dsn, "@")+1:]
	return rest[:strings.IndexByte(rest, '/')]
}

// TestFencedScope: the scope fences an update through gorm, from the claim
// given or the lock of the context; without the plugin, or outside a
// transaction, it refuses rather than write unfenced.
func TestFencedScope(t *testing.T) {
	db := databases()[0] // SQLite: the scope's logic is the same on all three
	g, dsn := fenceDB(t, db)
	ctx := context.Background()
	if err := openDB(t, db, dsn).Scopes(sqllock.Fenced(fence.Claim{Resource: "r", Token: 1})).Create(&fenceRow{Resource: "x"}).Error; !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("without the plugin: %v, want ErrInvalidOption", err)
	}
	s := newFenceStore(t, g).(fenceStore)
	if err := s.db.Scopes(sqllock.FencedByContext).Create(&fenceRow{Resource: "y"}).Error; !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("FencedByContext without a lock: %v, want ErrInvalidOption", err)
	}
	if err := s.db.Session(&gorm.Session{SkipDefaultTransaction: true}).Scopes(sqllock.Fenced(fence.Claim{Resource: "r", Token: 1})).
		Create(&fenceRow{Resource: "z"}).Error; !errors.Is(err, driver.ErrInvalidOption) {
		t.Errorf("without a transaction: %v, want ErrInvalidOption", err)
	}

	gd, err := guard.New(memory.New())
	if err != nil {
		t.Fatal(err)
	}
	row := fenceRow{Resource: uniqueKey(t)}
	var stale fence.Claim
	err = gd.Do(ctx, row.Resource, func(ctx context.Context, l *guard.Lock) error {
		stale = fence.Of(l)
		return s.db.WithContext(ctx).Scopes(sqllock.FencedByContext).Create(&row).Error
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	err = gd.Do(ctx, row.Resource, func(ctx context.Context, l *guard.Lock) error {
		return s.db.WithContext(ctx).Scopes(sqllock.FencedByContext).Model(&row).Update("value", "fresh").Error
	})
	if err != nil {
		t.Fatalf("second holder: %v", err)
	}
	err = s.db.Scopes(sqllock.Fenced(stale)).Model(&row).Update("value", "stale").Error
	if !errors.Is(err, sqllock.ErrStaleToken) || !errors.Is(err, fence.ErrStaleToken) || !errors.Is(err, guard.ErrLockLost) {
		t.Fatalf("stale update: %v", err)
	}
	if err := s.db.Scopes(sqllock.Fenced(stale)).Delete(&row).Error; !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("stale delete: %v", err)
	}
	var got fenceRow
	if err := s.db.First(&got, "resource = ?", row.Resource).Error; err != nil || got.Value != "fresh" {
		t.Fatalf("row %+v %v, want the second holder's value", got, err)
	}
}

// TestFencedScopeRawSQL: raw SQL under the scope (Exec, and Raw read
// through Scan or Find, which gorm cannot tell from a write such as an
// UPDATE ... RETURNING) is fenced like a create, update or delete: a stale
// claim is refused in a transaction and nothing is written, and outside one
// the statement is refused rather than run unfenced. Reads gorm builds from
// the model are not fenced.
func TestFencedScopeRawSQL(t *testing.T) {
	db := databases()[0] // SQLite: the scope's logic is the same on all three
	g, _ := fenceDB(t, db)
	s := newFenceStore(t, g).(fenceStore)
	ctx := context.Background()
	r := uniqueKey(t)
	fresh, stale := fence.Claim{Resource: r, Token: 10}, fence.Claim{Resource: r, Token: 9}
	if err := s.Set(ctx, fresh, "fresh"); err != nil {
		t.Fatal(err)
	}
	const update = "UPDATE warden_test_fence_data SET value = ? WHERE resource = ?"
	for name, write := range map[string]func(tx *gorm.DB) error{
		"Exec": func(tx *gorm.DB) error { return tx.Exec(update, "stale", r).Error },
		"Raw Scan": func(tx *gorm.DB) error {
			var v string
			return tx.Raw(update+" RETURNING value", "stale", r).Scan(&v).Error
		},
		"Raw Find": func(tx *gorm.DB) error {
			var rows []fenceRow
			return tx.Raw(update+" RETURNING *", "stale", r).Find(&rows).Error
		},
	} {
		err := s.db.Transaction(func(tx *gorm.DB) error { return write(tx.Scopes(sqllock.Fenced(stale))) })
		if !errors.Is(err, fence.ErrStaleToken) {
			t.Errorf("%s in a transaction under a stale claim: %v, want ErrStaleToken", name, err)
		}
		if err := write(s.db.Scopes(sqllock.Fenced(fresh))); !errors.Is(err, driver.ErrInvalidOption) {
			t.Errorf("%s outside a transaction: %v, want ErrInvalidOption", name, err)
		}
		var got fenceRow
		if err := s.db.First(&got, "resource = ?", r).Error; err != nil || got.Value != "fresh" {
			t.Fatalf("after %s: row %+v %v, want value fresh", name, got, err)
		}
	}
	err := s.db.Transaction(func(tx *gorm.DB) error {
		return tx.Scopes(sqllock.Fenced(fresh)).Exec(update, "again", r).Error
	})
	if err != nil {
		t.Fatalf("Exec in a transaction under the accepted claim: %v", err)
	}
	var got fenceRow
	if err := s.db.Scopes(sqllock.Fenced(stale)).First(&got, "resource = ?", r).Error; err != nil || got.Value != "again" {
		t.Fatalf("a model read under the scope, outside a transaction: %+v %v, want value again", got, err)
	}
}

// TestFenceDryRun: a dry run under the scope builds its SQL and leaves the
// fence alone (nothing is written, nothing to fence), and Fence in a dry-run
// session, which cannot check anything, is refused with ErrInvalidOption.
// Before, both reported the lock lost (the fence's own statements did not
// run), and on MySQL panicked reading the row that was never selected.
func TestFenceDryRun(t *testing.T) {
	for _, db := range databases() {
		t.Run(db.name, func(t *testing.T) {
			g, _ := fenceDB(t, db)
			s := newFenceStore(t, g).(fenceStore)
			ctx := context.Background()
			r := uniqueKey(t)
			if err := s.Set(ctx, fence.Claim{Resource: r, Token: 5}, "a"); err != nil {
				t.Fatal(err)
			}
			dry := s.db.Session(&gorm.Session{DryRun: true})
			var stmt *gorm.DB
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("dry run under the scope panicked: %v", p)
					}
				}()
				stmt = dry.Scopes(sqllock.Fenced(fence.Claim{Resource: r, Token: 9})).Create(&fenceRow{Resource: r + "/x"})
			}()
			if stmt.Error != nil || !strings.Contains(stmt.Statement.SQL.String(), "warden_test_fence_data") {
				t.Errorf("dry run under the scope: %v, SQL %q; want the insert's SQL", stmt.Error, stmt.Statement.SQL.String())
			}
			err := dry.Transaction(func(tx *gorm.DB) error { return sqllock.Fence(tx, r, 9) })
			if !errors.Is(err, driver.ErrInvalidOption) {
				t.Errorf("Fence in a dry run: %v, want ErrInvalidOption", err)
			}
			if st, err := s.Get(ctx, r); err != nil || st.Highest != 5 {
				t.Errorf("fence after the dry runs: %+v %v, want highest 5", st, err)
			}
		})
	}
}
