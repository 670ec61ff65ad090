package sqllock

import (
	"context"
	"fmt"

	"gorm.io/gorm"

	"github.com/warden-go/warden/fence"
	"github.com/warden-go/warden/guard/driver"
)

// fenceSetting is the statement setting under which Fenced leaves its claim
// for FencePlugin's callbacks.
const fenceSetting = "warden:fence"

// FencePlugin is the gorm plugin behind Fenced: register it once with
// db.Use(sqllock.FencePlugin{}). Its callbacks run Fence, in the statement's
// transaction, before the creates, updates and deletes of the statements
// Fenced marks and before their raw SQL (Exec, Raw), and leave every other
// statement alone.
type FencePlugin struct{}

// Name implements gorm.Plugin.
func (FencePlugin) Name() string { return fenceSetting }

// Initialize implements gorm.Plugin: the fence runs once the statement's
// transaction has begun (gorm's default transaction, or the caller's), and
// before the model's Before hooks and the write. Raw SQL reaches gorm's
// raw, row and query callbacks, which take no default transaction: it is
// fenced in the caller's transaction and refused outside one, since an
// UPDATE ... RETURNING read through Raw writes as much as Exec does.
func (FencePlugin) Initialize(db *gorm.DB) error {
	cb := db.Callback()
	for _, err := range []error{
		cb.Create().After("gorm:begin_transaction").Before("gorm:before_create").Register(fenceSetting, fenceStatement),
		cb.Update().After("gorm:begin_transaction").Before("gorm:before_update").Register(fenceSetting, fenceStatement),
		cb.Delete().After("gorm:begin_transaction").Before("gorm:before_delete").Register(fenceSetting, fenceStatement),
		cb.Raw().Before("gorm:raw").Register(fenceSetting, fenceStatement),
		cb.Row().Before("gorm:row").Register(fenceSetting, fenceRawSQL),
		cb.Query().Before("gorm:query").Register(fenceSetting, fenceRawSQL),
	} {
		if err != nil {
			return fmt.Errorf("warden: sqllock: FencePlugin: %w", err)
		}
	}
	return nil
}

// Fenced is a gorm scope that fences the statement's writes with c: the
// statement's transaction runs Fence(tx, c.Resource, c.Token) before it
// writes, and rolls back with an error wrapping fence.ErrStaleToken when the
// resource accepted a higher token. It needs FencePlugin registered on the
// *gorm.DB and a transaction: gorm's default one (unless
// SkipDefaultTransaction) or the caller's db.Transaction. Raw SQL (Exec,
// Raw) is fenced too, whether it reads or writes, and needs the caller's
// transaction; reads gorm builds from the model (Find, First) are not, nor
// is a dry run, which writes nothing. Read Raw's rows through Scan, Rows or
// Find, which return the refusal as an error: gorm's Row returns a nil
// *sql.Row for a statement a callback refused, as the fence refuses a stale
// claim's, and its Scan then panics.
//
//	err := db.WithContext(ctx).Scopes(sqllock.Fenced(claim)).
//		Model(&Account{ID: 42}).Update("balance", 10).Error
//
// FencedByContext takes the claim from the statement's context instead.
func Fenced(c fence.Claim) func(*gorm.DB) *gorm.DB {
	return func(db *gorm.DB) *gorm.DB {
		if err := c.Validate(); err != nil {
			db.AddError(err)
			return db
		}
		if _, ok := db.Config.Plugins[fenceSetting]; !ok {
			db.AddError(fmt.Errorf("warden: sqllock: %w: Fenced needs db.Use(sqllock.FencePlugin{}), or the write would not be fenced", driver.ErrInvalidOption))
			return db
		}
		db.Statement.Settings.Store(fenceSetting, c)
		return db
	}
}

// FencedByContext is Fenced with the claim of the statement's context
// (fence.FromContext: the lock guard.Do's function was given, or a claim
// httpmw.Fence received), set with db.WithContext. A context without one
// fails the statement with guard.ErrInvalidOption rather than write
// unfenced.
func FencedByContext(db *gorm.DB) *gorm.DB {
	c, ok := fence.FromContext(db.Statement.Context)
	if !ok {
		db.AddError(fmt.Errorf("warden: sqllock: %w: FencedByContext: the statement's context carries no lock nor claim", driver.ErrInvalidOption))
		return db
	}
	return Fenced(c)(db)
}

// fenceRawSQL fences a read callback's statement when it is the caller's
// SQL (Raw), which may write, and leaves the SELECTs gorm builds alone.
func fenceRawSQL(db *gorm.DB) {
	if db.Statement.SQL.Len() > 0 {
		fenceStatement(db)
	}
}

func fenceStatement(db *gorm.DB) {
	if db.Error != nil || db.DryRun {
		return // a dry run writes nothing: nothing to fence
	}
	v, ok := db.Statement.Settings.Load(fenceSetting)
	if !ok {
		return
	}
	c := v.(fence.Claim)
	if err := Fence(db, c.Resource, c.Token); err != nil {
		db.AddError(err)
	}
}

// Fencer keeps resources' highest tokens in the fence table alone, each
// check a transaction of its own: the fence.Fencer of httpmw.Fence on SQL.
type Fencer struct{ db *gorm.DB }

// NewFencer returns a Fencer on db, whose fence table Locker.Migrate
// created.
func NewFencer(db *gorm.DB) (*Fencer, error) {
	if db == nil {
		return nil, fmt.Errorf("warden: sqllock: %w: nil *gorm.DB", driver.ErrInvalidOption)
	}
	return &Fencer{db: db}, nil
}

// Advance implements fence.Fencer.
func (f *Fencer) Advance(ctx context.Context, c fence.Claim) error {
	if err := c.Validate(); err != nil {
		return err
	}
	return f.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return Fence(tx, c.Resource, c.Token) })
}
