// connect_grpc in a build without grpc++ (kiln perf speaks HTTP only there).
#include "perf/client.h"

namespace kiln::perf {

Expected<std::unique_ptr<Client>> connect_grpc(const Endpoint&, int) {
  return KILN_ERROR(
      "-i grpc: this build of kiln has no gRPC client (grpc++ was not found when it was built); "
      "use -i http");
}

}  // namespace kiln::perf
