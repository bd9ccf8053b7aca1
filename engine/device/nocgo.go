//go:build !cgo

package device

// Without cgo (CGO_ENABLED=0: the static binary of the container image)
// there is no way to call the CUDA driver, so the process behaves as on a
// host without a GPU: Load fails with ErrNoDriver, Present finds nothing,
// and host memory ("cpu", "*") works as everywhere. The methods below exist
// for the callers to compile; no *Driver is ever handed out.

// Driver is the loaded CUDA driver; this build never has one.
type Driver struct{}

// Load reports that this build cannot load the driver.
func Load() (*Driver, error) { return nil, ErrNoDriver }

// Present is nil: this build never loads the driver.
func Present() *Driver { return nil }

func (d *Driver) Devices() int                             { return 0 }
func (d *Driver) Path() string                             { return "" }
func (d *Driver) CheckDevice(int) error                    { return ErrNoDriver }
func (d *Driver) Copy(int, uintptr, uintptr, uint64) error { return ErrNoDriver }
func (d *Driver) AllocHost(uint64) (uintptr, error)        { return 0, ErrNoDriver }
func (d *Driver) FreeHost(uintptr) error                   { return ErrNoDriver }
func (d *Driver) CloseIPC(int, uintptr) error              { return ErrNoDriver }
func (d *Driver) AllocDevice(int, uint64) (uintptr, error) { return 0, ErrNoDriver }
func (d *Driver) FreeDevice(int, uintptr) error            { return ErrNoDriver }
func (d *Driver) OpenIPC(int, IPCHandle) (uintptr, error)  { return 0, ErrNoDriver }
func (d *Driver) IPCHandle(int, uintptr) (IPCHandle, error) {
	return IPCHandle{}, ErrNoDriver
}
func (d *Driver) Locate(uintptr) (dev int, onDevice bool, err error) {
	return 0, false, ErrNoDriver
}
func (d *Driver) Range(int, uintptr) (base uintptr, size uint64, err error) {
	return 0, 0, ErrNoDriver
}
