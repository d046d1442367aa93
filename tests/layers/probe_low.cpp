// A planted back-edge for layers.CatchesBackEdges: the "lower layer" uses the higher one's typeinfo
// and nothing else (no function call that the old symbol check would have seen).
#include <typeinfo>
namespace lfce { namespace autotune { struct Probe { virtual ~Probe(); virtual int f(); }; } }
namespace lfce { namespace runtime { const std::type_info& probe_type() { return typeid(lfce::autotune::Probe); } } }
