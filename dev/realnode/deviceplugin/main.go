// Command deviceplugin serves fake GPUs to a kubelet through the device plugin
// API (v1beta1), so that tests see what a real kubelet does with devices: it
// allocates them to containers and, since KEP-4680, reports their health in
// the pods' status (allocatedResourcesStatus). A test flips a device's health
// by writing the health file; nothing else about the devices is real.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const (
	resourceName = "torchfleet.dev/fake-gpu"
	envName      = "FAKE_GPU_IDS"
	// Polling is enough for a test's health flips, and needs no fsnotify.
	pollEvery = 200 * time.Millisecond
)

type plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	count      int
	healthFile string

	mu      sync.Mutex
	health  map[string]string // device ID -> Healthy or Unhealthy
	changed chan struct{}     // closed and replaced on every health change
}

func (p *plugin) ids() []string {
	ids := make([]string, p.count)
	for i := range ids {
		ids[i] = fmt.Sprintf("fake-gpu-%d", i)
	}
	return ids
}

// readHealth is every device Healthy unless the file says otherwise. A file
// that does not parse (half written) keeps what we had, so that a test's
// write is never seen as "all healthy again" midway.
func (p *plugin) readHealth(previous map[string]string) map[string]string {
	health := map[string]string{}
	for _, id := range p.ids() {
		health[id] = pluginapi.Healthy
	}
	if p.healthFile == "" {
		return health
	}
	data, err := os.ReadFile(p.healthFile)
	if os.IsNotExist(err) {
		return health
	}
	var listed map[string]string
	if err == nil {
		err = json.Unmarshal(data, &listed)
	}
	if err != nil {
		if previous != nil {
			return previous
		}
		return health
	}
	for id, h := range listed {
		if _, ok := health[id]; ok && (h == pluginapi.Healthy || h == pluginapi.Unhealthy) {
			health[id] = h
		}
	}
	return health
}

func (p *plugin) watchHealth(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(pollEvery):
		}
		p.mu.Lock()
		if next := p.readHealth(p.health); !reflect.DeepEqual(next, p.health) {
			log.Printf("health: %v", next)
			p.health = next
			close(p.changed)
			p.changed = make(chan struct{})
		}
		p.mu.Unlock()
	}
}

func (p *plugin) devices() ([]*pluginapi.Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var devices []*pluginapi.Device
	for _, id := range p.ids() {
		devices = append(devices, &pluginapi.Device{ID: id, Health: p.health[id]})
	}
	return devices, p.changed
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the whole list first and again on every health change:
// the kubelet takes each response as the complete set.
func (p *plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		devices, changed := p.devices()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

// Allocate gives each container its device IDs in an env var, and nothing
// else: there is no device node to mount.
func (p *plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{envName: strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Registration is the kubelet's plugin watcher's side: it finds our socket
// in its plugins_registry folder, asks what we are, and then dials the same
// socket as a device plugin. It does so again whenever it (re)starts or the
// socket is (re)made, so a restarted kubelet needs nothing from us.
type registration struct {
	registerapi.UnimplementedRegistrationServer
}

func (registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.DevicePlugin,
		Name:              resourceName,
		SupportedVersions: []string{pluginapi.Version},
	}, nil
}

func (registration) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		log.Printf("registered %s with the kubelet", resourceName)
	} else {
		log.Printf("the kubelet refused %s: %s", resourceName, s.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func main() {
	// Not the kubelet.sock of /var/lib/kubelet/device-plugins: the kubelet
	// keeps that path whatever its --root-dir, so every kubelet on a machine
	// would share it. Its plugins_registry follows --root-dir.
	registryDir := flag.String("registry-dir", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registration folder (<--root-dir>/plugins_registry)")
	count := flag.Int("count", 2, "how many fake GPUs to serve")
	healthFile := flag.String("health-file", "", `JSON {"fake-gpu-1": "Unhealthy"}; absent devices are Healthy`)
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	p := &plugin{count: *count, healthFile: *healthFile, changed: make(chan struct{})}
	p.health = p.readHealth(nil)
	go p.watchHealth(ctx)

	socket := filepath.Join(*registryDir, "torchfleet-fake-gpu.sock")
	_ = os.Remove(socket) // a previous run's
	listener, err := net.Listen("unix", socket)
	if err != nil {
		log.Fatal(err)
	}
	server := grpc.NewServer()
	registerapi.RegisterRegistrationServer(server, registration{})
	pluginapi.RegisterDevicePluginServer(server, p)
	go func() {
		<-ctx.Done()
		// The socket's removal is what deregisters us.
		_ = os.Remove(socket)
		server.Stop()
	}()
	log.Printf("serving %d of %s on %s", *count, resourceName, socket)
	if err := server.Serve(listener); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}
