// The probe's higher layer (empty: only its folder name matters to the include check).
#pragma once
