package envd_test

import (
	"os"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/filesystem"
	"github.com/sandgate/sandgate/rest/compat/e2b/envd/gen/process"
)

// TestProtoMatchesSDK compares our .proto files with the descriptors the
// e2b Python SDK (2.63.0) ships in envd/process/process_pb.py and
// envd/filesystem/filesystem_pb.py (testdata/sdk-*.desc, the serialized
// FileDescriptorProto each file passes to file_desc): every message, field
// (name, number, type, label, oneof), enum and method must be the same;
// only the language options differ.
func TestProtoMatchesSDK(t *testing.T) {
	for _, tc := range []struct {
		sdk  string
		ours protoreflect.FileDescriptor
	}{
		{"testdata/sdk-process.desc", process.File_process_process_proto},
		{"testdata/sdk-filesystem.desc", filesystem.File_filesystem_filesystem_proto},
	} {
		t.Run(tc.sdk, func(t *testing.T) {
			b, err := os.ReadFile(tc.sdk)
			if err != nil {
				t.Fatal(err)
			}
			want := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(b, want); err != nil {
				t.Fatal(err)
			}
			got := protodesc.ToFileDescriptorProto(tc.ours)
			want.Options, got.Options = nil, nil
			want.SourceCodeInfo, got.SourceCodeInfo = nil, nil
			if !proto.Equal(want, got) {
				t.Errorf("our descriptor differs from the SDK's:\nSDK:  %v\nours: %v", want, got)
			}
		})
	}
}
