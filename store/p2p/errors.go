package p2p

import "errors"

// Sentinels. Errors returned by the Store wrap one of them (test with
// errors.Is); engine failures wrap both ErrTransferEngine and the engine's
// own error, so errors.Is(err, engine.ErrSocket) works too.
var (
	// ErrInvalidArgument: a bad argument, or buffers whose total size is not
	// the object's.
	ErrInvalidArgument = errors.New("p2p: invalid argument")
	// ErrAddressOverlapped: a buffer overlaps memory this Store already
	// registered with a different range.
	ErrAddressOverlapped = errors.New("p2p: address overlapped")
	// ErrPayloadOpened: the name is already opened on this Store, or, for
	// Register without forceCreate, already published by someone.
	ErrPayloadOpened = errors.New("p2p: payload opened")
	// ErrPayloadNotOpened: Unregister or DeleteReplica of a name this Store
	// does not hold in that role.
	ErrPayloadNotOpened = errors.New("p2p: payload not opened")
	// ErrPayloadNotFound: no such object in the metadata.
	ErrPayloadNotFound = errors.New("p2p: payload not found")
	// ErrTooManyRetries: a shard failed from every source tried, or the
	// object kept changing under a GetReplica.
	ErrTooManyRetries = errors.New("p2p: too many retries")
	// ErrTransferEngine: the Transfer Engine refused or failed a call.
	ErrTransferEngine = errors.New("p2p: transfer engine")
	// ErrMetadata: etcd failed, or holds a record that is not a valid
	// payload.
	ErrMetadata = errors.New("p2p: metadata")
	// ErrClosed: a call on a closed Store.
	ErrClosed = errors.New("p2p: store closed")
)
